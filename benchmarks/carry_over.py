"""Carry tuned entries across a template change that leaves their kernels' code as it was.

Any edit to a direction's templates changes its template hash, and dispatch then ignores every
tuned entry of that direction until it is tuned again. An entry whose variant renders to the
same code under the old and the new templates (comments, docstrings and the generated name
aside) measured exactly the code that would run now, so it stays valid: this writes those
entries under the current hash and drops the rest, which need the GPU again. (Whether a
kept entry is still its bucket's best is another question: the tuner's next study of that
bucket starts from it.)

usage: python benchmarks/carry_over.py OLD CONFIG.yaml -o OUT.yaml [--direction fwd]

OLD is the git revision the entries were tuned on, or a folder holding that version's fa2gen
package; it renders the old code in a child process. The current package renders the new. Entries of other directions
pass through unchanged. Then `fa2gen import OUT.yaml` (or copy it over the shipped file).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile


def normalised(source: str) -> str:
    """A module's code without its comments, docstrings and formatting: its syntax tree."""
    import ast

    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


# Renders (bucket key, params) pairs read as JSON from stdin with whichever fa2gen is first on
# the path, and prints each variant's normalised code (null where it no longer renders). The
# generated name is fixed: it derives from the template hash, which differs by design.
_RENDER = (
    inspect.getsource(normalised)
    + r"""
import json, sys
from fa2gen.generator.rendering import render
from fa2gen.generator.spec import SpecError, TuningParams
from fa2gen.store.buckets import Bucket

out = []
for key, params in json.load(sys.stdin):
    try:
        out.append(normalised(render(Bucket.parse(key).kernel_spec(), TuningParams(**params), name="variant")))
    except SpecError:
        out.append(None)
print(json.dumps(out))
"""
)


def rendered(pairs: list, package_root: str | None) -> list:
    """Normalised code of each (bucket key, params) pair, rendered by the fa2gen package under
    ``package_root`` (None: the one this process imports, whose template hash the kept entries
    get). The child runs in that folder, which ``python -c`` puts first on its path."""
    if package_root is None:
        import fa2gen

        package_root = os.path.dirname(os.path.dirname(os.path.abspath(fa2gen.__file__)))
    done = subprocess.run(
        [sys.executable, "-c", _RENDER],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        check=True,
        cwd=package_root,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def old_package(old: str, into: str) -> str:
    """The folder holding the old fa2gen package: ``old`` itself, or the package as it was at
    the git revision ``old``, unpacked under ``into``."""
    if os.path.isdir(os.path.join(old, "fa2gen")):
        return os.path.abspath(old)
    archive = subprocess.run(["git", "archive", old, "fa2gen"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def main() -> None:
    from fa2gen import __version__
    from fa2gen.generator.rendering import template_hash
    from fa2gen.store import yamlfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="git revision the entries were tuned on, or a folder holding its fa2gen")
    ap.add_argument("config", help="tuned-config YAML file")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--direction", default="fwd", choices=("fwd", "bwd"))
    args = ap.parse_args()

    config = yamlfile.read(args.config)
    ours = [e for e in config.entries if e.bucket.direction == args.direction]
    pairs = [(e.bucket.key, e.params.to_dict()) for e in ours]
    with tempfile.TemporaryDirectory() as tmp:
        before = rendered(pairs, old_package(args.old, tmp))
    after = rendered(pairs, None)
    new_hash = template_hash(args.direction)
    kept, dropped = [], []
    for e, old, new in zip(ours, before, after):
        if old is not None and old == new:
            kept.append(dataclasses.replace(e, validity=dataclasses.replace(e.validity, template_hash=new_hash)))
        else:
            dropped.append(e)
    others = [e for e in config.entries if e.bucket.direction != args.direction]
    text = yamlfile.dump(
        others + kept, arch=config.arch, fa2gen_version=__version__, torch_version=config.meta["torch"]
    )
    with open(args.output, "w") as f:
        f.write(text)
    for e in dropped:
        print(f"needs tuning again: {e.bucket.key} ({e.params.label()})", file=sys.stderr)
    print(
        f"{args.direction}: {len(kept)} of {len(ours)} entries carried over to template hash {new_hash}; "
        f"{len(dropped)} changed"
    )


if __name__ == "__main__":
    main()
