"""The wait-for graph and collective signatures (pure).

In: the analysis context (``analyze/context.Ctx``: one indexed view per rank). Out: the
instances ranks are blocked in, their missing and ahead members, cycles (``waitgraph``);
who changed when signatures differ (``sigclasses``, ``skippedcall``); the evidence of
order and counts used to break ties: group creation order (``groupdefs``), the order two
groups were interleaved (``grouporder``), per-step counts (``stepcounts``), role groups
(``role_groups``) and two threads sharing a group (``threadgroups``).
"""
