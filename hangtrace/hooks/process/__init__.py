"""The process's own life: start and exit records, uncaught exceptions and signals
(``lifecycle``; the functions it patches: ``patching``; the kernel's fault line:
``faultline``), failures caught at their source before a launcher swallows them
(``failures``), torchelastic error files (``elastic_errors``), pending asyncio tasks
(``asyncio_tasks``) and faulthandler kept on top of DataLoader worker signal handlers
(``workersignals``). Out: lifecycle records in the ring, faulthandler files.
"""
