"""Memory analysis (issue 5): samples, ledger, trends, kept-across flags, death attribution.

Pure functions on plain data (``ProcessInfo.memory`` samples, ``ProcessInfo.memory_facts``
gathered at collection time, ``ProcessInfo.meta``): no I/O, unit-testable on synthetic
processes. Bytes are ints; times are ns since the Unix epoch.

Samples (:func:`samples`, from the K_MEM ring records, layout in ``tracer/ring/layout.py``),
the ledger, kept-across flags, trends and attribution are described in their modules.

Modules: ``samples`` (decoding, helpers), ``ledger`` (ledger, kept-across flags),
``trend``, ``attribution`` (a death's memory cause; a process's level at death in
``deathlevel``, its DataLoader workers' deaths in ``helperdeaths``), ``summary``
(``details['memory']``). In: ProcessInfo objects and a rank's cause from
``failures/deaths``; out: plain dicts (an attribution, ``details['memory']``).
The public API is re-exported here.
"""

from hangtrace.tracer.analyze.memory.attribution import attribute
from hangtrace.tracer.analyze.memory.ledger import kept_across, ledger
from hangtrace.tracer.analyze.memory.samples import (
    LOW,
    MIB,
    NEAR,
    _primary,
    fmt_bytes,
)
from hangtrace.tracer.ring.memsamples import samples
from hangtrace.tracer.analyze.memory.summary import (
    LEDGER_MAX_RANKS,
    LEDGER_MAX_STEPS,
    MEMORY_CAUSES,
    SIGNIFICANT_BYTES,
    SIGNIFICANT_FRACTION,
    analyse_process,
    significant,
    significant_bytes,
    summarize,
    watch_lines,
)
from hangtrace.tracer.analyze.memory.trend import trend

__all__ = [
    "significant",
    "significant_bytes",
    "samples",
    "ledger",
    "kept_across",
    "trend",
    "attribute",
    "summarize",
    "watch_lines",
    "fmt_bytes",
    "NEAR",
    "LOW",
    "MIB",
    "LEDGER_MAX_RANKS",
    "LEDGER_MAX_STEPS",
    "MEMORY_CAUSES",
    "SIGNIFICANT_BYTES",
    "SIGNIFICANT_FRACTION",
    "analyse_process",
    "_primary",
]
