"""Compile, for one arch and without a GPU, every variant fa2gen would dispatch there: the
default of every bucket of the default tuning grid and every entry of every shipped config
file of that arch. Prints one JSON line: {"variants": N, "kernels": K, "failures": {...}}.

usage: python tests/compile_all.py [--arch sm90] [--workers 2] [--only shipped|defaults] [--gluon-only]

Run by tests/test_triton_versions.py under each supported Triton (TRITON_INTERPRET unset).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor


def variants(arch: str, only: str | None = None, gluon_only: bool = False) -> list[tuple]:
    """Unique variants as (spec, params) dicts, in a fixed order: one per spec and rendered code
    (params that render alike, such as the decode template's split counts, a launch's numbers,
    compile alike); with ``gluon_only``, those that render a Gluon template (what differs most
    between Triton versions)."""
    from fa2gen.runtime.defaults import bucket_default
    from fa2gen.store.shipped import shipped_files
    from fa2gen.tuner.grid import default_buckets

    pairs = {}
    if only in (None, "defaults"):
        for bucket in default_buckets(("fwd", "bwd", "decode")):
            if bucket.direction == "decode" and bucket.dtype != "bf16":
                continue  # (the decode kernels compile alike in fp16: one dtype keeps the check short)
            spec, params = bucket.kernel_spec(), bucket_default(bucket, arch)
            pairs.setdefault(_key(spec, params), (spec.to_dict(), params.to_dict()))
    if only in (None, "shipped"):
        for _, cfg in shipped_files(arch):
            for entry in cfg.entries:
                spec = entry.bucket.kernel_spec()
                pairs.setdefault(_key(spec, entry.params), (spec.to_dict(), entry.params.to_dict()))
    return [(spec, params) for spec, params in pairs.values() if params["gluon"] or not gluon_only]


def _key(spec, params) -> tuple:
    from fa2gen.generator.identity import code_digest

    return json.dumps(spec.to_dict(), sort_keys=True), code_digest(spec, params)


def _compile(job) -> tuple[str, int, str | None]:
    arch, (spec, params) = job
    from fa2gen.generator.ahead import compile_for
    from fa2gen.generator.spec import KernelSpec, TuningParams

    spec, params = KernelSpec.from_dict(spec), TuningParams.from_dict(params)  # (params: with template knobs)
    label = f"{spec.to_dict()} {params.label()}"
    try:
        return label, len(compile_for(spec, params, arch)), None
    except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the others
        while e.__cause__ or e.__context__:
            e = e.__cause__ or e.__context__
        return label, 0, f"{type(e).__name__}: {str(e)[:400]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", choices=("shipped", "defaults"))
    ap.add_argument("--gluon-only", action="store_true")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compile_all.py: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    jobs = [(args.arch, v) for v in variants(args.arch, args.only, args.gluon_only)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_compile, jobs))
    failures = {label: why for label, _, why in results if why}
    print(json.dumps({"variants": len(results), "kernels": sum(n for _, n, _ in results), "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
