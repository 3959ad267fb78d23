"""Deaths, departures and teardown (pure).

In: the context's per-rank views and their lifecycle events. Out: which ranks died, of
what and when, and which deaths are victims (``deaths``); a rank whose program returned
while peers needed it (``departures``); the SIGTERMs of a job's teardown (``teardown``);
torchelastic error files (``elastic``); exceptions a rank survived (``exceptions``);
restarts: earlier attempts (``attempts``), a rank restarted alone (``lonerestart``) and
what its new process does (``replacement``).
"""
