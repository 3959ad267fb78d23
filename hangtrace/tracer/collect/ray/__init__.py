"""Ray collectors (impure): a Ray run collected across its cluster, and Ray's own record.

In: a Ray cluster (its GCS address, token authentication), the run directory's rings on
every alive node, Ray's state API or GCS tables, and Ray's session logs on disk.
Out: one ``tracer.snapshot.Snapshot`` for the whole cluster, stored under
``RUN_DIR/snapshots/<time>-ray/`` with ``ray_nodes.json`` and ``ray_state.json``, its
processes joined with Ray's actor/worker records (``meta``), and Ray's word on dead
workers as ``memory_facts``.

``rayjob``: the watcher's collection in a child process (``ray_collect``), ``is_ray_run``;
``raycluster``: ``dump_cluster`` (one pinned task per node) and ``load_ray_snapshot``;
``raystate``: Ray's actors/workers/tasks (``fetch``), ``rayjoin``: their join into the
processes (``joined``);
``raylogs``: worker exits and OOM kills from the session logs; ``rayauth``: token
authentication before connecting; ``raygcs``: the GCS reachability check.
"""
