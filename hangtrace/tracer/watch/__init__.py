"""Detection and supervision.

In: ring headers polled over time (``detector.Watcher``; ``watcher`` runs it as a process);
a command to run traced (``supervise.supervise``, what ``hangtrace run`` does).
Out: incidents (stall, dead rank) handed to ``tracer.pipeline.dump_live``, memory early
warnings in the watcher log, and the supervised command's exit status.
"""
