"""Which training framework ran the job, and whether hangtrace was tested with its version
(issue 37, "bad input": a framework version we do not know still gets the general
mechanisms, and the verdict says which framework and version it saw).

In: the run's environment records (``Ctx.envs``, ``tracer/envfacts.ProcessEnv``): each
record's ``frameworks`` (the marker modules of ``envformat.FRAMEWORK_MODULES`` found in
``sys.modules`` when the process recorded it, at ``init_process_group`` for a rank: a dict
lookup each, nothing per collective) and ``packages`` (the installed versions of the
imported distributions, ``hooks/env/pkgversions``). Out: ``details['frameworks']`` (a list
of ``{'name', 'module', 'distribution', 'versions', 'tested', 'tested_versions', 'ranks'}``,
ranks -1 for a process without one) and one evidence line. Nothing is decided from it:
every framework gets the same rules. Pure.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

from hangtrace.tracer.envfacts import ProcessEnv


class Framework(NamedTuple):
    """A framework: its name, the module whose presence says it runs, the distribution that
    carries its version, and the versions hangtrace was tested with."""

    name: str
    module: str
    distribution: str  # as recorded in ``packages`` (normalized: lower case, ``_``)
    tested: Tuple[str, ...]


#: The versions the blind framework corpus (tests/integration/blind/frameworks/) was written
#: and measured with: the ``frameworks`` extra of setup.cfg (ray[train]==2.60.0,
#: pytorch-lightning==2.6.6, transformers==5.25.0, accelerate==1.16.0). The unified
#: ``lightning`` package was not tested. Most specific first: the Hugging Face Trainer
#: runs on Accelerate, Ray Train may run either.
FRAMEWORKS: Tuple[Framework, ...] = (
    Framework("Ray Train", "ray.train", "ray", ("2.60.0",)),
    Framework("PyTorch Lightning", "pytorch_lightning", "pytorch_lightning", ("2.6.6",)),
    Framework("Lightning", "lightning.pytorch", "lightning", ()),
    Framework("Hugging Face Trainer", "transformers.trainer", "transformers", ("5.25.0",)),
    Framework("Accelerate", "accelerate.accelerator", "accelerate", ("1.16.0",)),
)

NOT_TESTED = "not a version hangtrace was tested with"


def _norm(name: str) -> str:
    out = name.lower().replace("-", "_").replace(".", "_")
    while "__" in out:
        out = out.replace("__", "_")
    return out


def _version(pe: ProcessEnv, fw: Framework) -> str:
    """The version of ``fw``'s distribution in ``pe``'s packages ('' when not recorded)."""
    for dist, ver in pe.packages:
        if _norm(dist) == fw.distribution:
            return ver
    return (pe.ray or "") if fw.distribution == "ray" else ""


def frameworks_seen(envs: Sequence[ProcessEnv]) -> List[Dict[str, Any]]:
    """The frameworks the records saw, in ``FRAMEWORKS`` order, as ``details['frameworks']``
    entries (empty when no record names one: records of older versions, a plain torch job)."""
    out: List[Dict[str, Any]] = []
    for fw in FRAMEWORKS:
        having = [pe for pe in envs if fw.module in pe.frameworks]
        if not having:
            continue
        versions = sorted({_version(pe, fw) for pe in having} - {""})
        out.append(
            {
                "name": fw.name,
                "module": fw.module,
                "distribution": fw.distribution,
                "versions": versions,
                "tested": bool(versions) and all(v in fw.tested for v in versions),
                "tested_versions": list(fw.tested),
                "ranks": sorted({pe.rank for pe in having}),
            }
        )
    return out


def framework_phrase(entry: Dict[str, Any]) -> str:
    """'PyTorch Lightning 2.6.6', or 'PyTorch Lightning 2.7.0 (not a version hangtrace was tested
    with; tested: 2.6.6)', or '... (version not recorded)'."""
    name, versions, tested = entry["name"], entry["versions"], entry["tested_versions"]
    if not versions:
        return "%s (version not recorded)" % name
    text = "%s %s" % (name, " / ".join(versions))
    if entry["tested"]:
        return text
    return "%s (%s%s)" % (text, NOT_TESTED, "; tested: %s" % ", ".join(tested) if tested else "")


def framework_line(seen: Sequence[Dict[str, Any]]) -> str:
    """The evidence line of ``frameworks_seen``'s entries ('' when none)."""
    if not seen:
        return ""
    line = "framework%s seen in the records: %s" % (
        "s" if len(seen) > 1 else "",
        ", ".join(framework_phrase(e) for e in seen),
    )
    if not all(e["tested"] for e in seen):
        line += "; the general mechanisms apply, framework-specific knowledge may not fit this version"
    return line
