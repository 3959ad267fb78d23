"""Deaths, departures and teardown (pure).

In: the per-rank views (``analyze/rankview.RankView``) and their lifecycle events; for the
job-level answers the context (``analyze/context.Ctx``). Out: what error texts and phases
say (``causes``: transport errors, stops, raised phases, a record's end); which ranks died,
of what and when, and which deaths are victims (``deaths``); whether a death came after a
hang began or into it (``afterhang``); a rank whose program returned while peers needed it
(``departures``); the SIGTERMs of a job's teardown (``teardown``); torchelastic error files
(``elastic``); exceptions a rank survived (``exceptions``); restarts: earlier attempts
(``attempts``), a rank restarted alone (``lonerestart``) and what its new process does
(``replacement``). Imports go one way: ``causes`` <- ``departures``, ``teardown`` <-
``deaths`` <- ``context``; none of them imports the context at run time.
"""
