"""The stack model (pure): the thread/frame format of every stack source and its parsers.

In: py-spy's JSON dumps and faulthandler's text dumps (as collected by ``collect/stacks.py``
and ``collect/faulthandler.py``, or kept in a snapshot's ``signals``). Out: threads in one
format (``threads``: the format, py-spy's normalisation, frame labels and keys, a thread
list's main thread), the dumps of a faulthandler file (``faulthandler_text``), and which
frames are the user's own code (``usercode``). No I/O, no processes: collection and
analysis both import it, and it imports neither.
"""
