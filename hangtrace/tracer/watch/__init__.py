"""Detection and supervision: the node watcher (stall, dead rank) and what it triggers.
"""
