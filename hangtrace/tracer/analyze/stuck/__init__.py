"""The wait explainers: why a rank outside collectives is stuck (pure).

In: a process's stacks (py-spy or faulthandler, in the thread format of
``tracer/stackmodel``: faulthandler text parsed there, the user's frames told there), the
kernel's word on its blocked system call, its children, helpers and sockets; a rank's view
(``analyze/rankview``). Out: evidence sentences and facts shared
by the rules: one explainer per kind of wait - a stack read in words (``blocking``),
polling loops (``pollwait``), locks (``lockwait``), DataLoader workers (``loaderwait``),
its own async work (``workwait``), a child process (``childwait``), a local TCP peer
(``peerwait``), a program that returned but does not exit (``exitwait``), an import
(``importing``), an asyncio await chain (``asynctasks``); the chain ends of the wait-for
graph (``chainends``) and STAT's merged stack tree (``stacktree``).
"""
