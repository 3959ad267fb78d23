"""Ray actors (pure).

In: processes with a Ray identity and their actor-call records. Out: the wait-for graph
across actor calls (``actorgraph``) and actor ranks whose method returned while peers
still needed them (``actorreturn``).
"""
