"""The ring file: THE contract between traced processes and everything else.

``layout``: constants, slot/header structs and ring creation (imported by traced processes);
``reader``: validation and decoding (collection, ``hangtrace records``). Format: docs/FORMAT.md.
"""
