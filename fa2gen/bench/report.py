"""Benchmark output: a ratio table for the terminal or Markdown, JSON, and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path

from .grid import Case
from .runner import Result, geomean

SHORT = {
    "fa2gen": "fa2gen",
    "fa2gen-default": "default",
    "fa2gen-bf16": "own-bf16",
    "sdpa-cudnn": "cuDNN",
    "sdpa-flash": "FA2",
    "sdpa-efficient": "mem-eff",
    "flex": "Flex",
    "sdpa-math": "math",
}


# A provider's 20th and 80th percentile run times this far apart mark an unsteady cell: its
# launches wait on the host in some runs and not in others, so its median moves between runs.
UNSTEADY = 1.15
UNSTEADY_MARK = "~"


def unsteady(r: Result, provider: str) -> bool:
    """Whether ``provider``'s runs of this cell spread past ``UNSTEADY`` (p80 / p20)."""
    ms = r.ms.get(provider)
    return bool(ms) and ms[0] > 0 and ms[2] / ms[0] > UNSTEADY


def ratio_rows(results: list[Result], providers: list[str]):
    """Per case: TFLOP/s of each provider (marked where unsteady) and fa2gen's ratio to each
    other provider."""
    others = [p for p in providers if p != "fa2gen"]
    header = ["case"] + [SHORT.get(p, p) for p in providers] + [f"x{SHORT.get(p, p)}" for p in others]

    def fmt(x: float) -> str:
        return f"{x:.0f}" if x >= 10 else f"{x:.2g}"

    rows = []
    for r in results:
        mine = r.tflops.get("fa2gen")
        cells = [r.case.label()] + [
            fmt(r.tflops[p]) + (UNSTEADY_MARK if unsteady(r, p) else "") if p in r.tflops else "-" for p in providers
        ]
        for p in others:
            cells.append(f"{mine / r.tflops[p]:.2f}" if mine and p in r.tflops else "-")
        rows.append(cells)
    return header, rows


def summary(results: list[Result], providers: list[str]) -> dict[str, float]:
    """Geomean of fa2gen's ratio to each provider over the cases both ran."""
    out = {}
    for p in providers:
        if p == "fa2gen":
            continue
        ratios = [r.tflops["fa2gen"] / r.tflops[p] for r in results if "fa2gen" in r.tflops and p in r.tflops]
        if ratios:
            out[p] = geomean(ratios)
    return out


def markdown(results: list[Result], providers: list[str]) -> str:
    header, rows = ratio_rows(results, providers)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    gm = summary(results, providers)
    if gm:
        lines.append("")
        lines.append("Geomean of fa2gen's ratio: " + ", ".join(f"{SHORT.get(p, p)} {v:.2f}x" for p, v in gm.items()))
    marked = sum(unsteady(r, p) for r in results for p in providers if p in r.tflops)
    if marked:
        noun = "entry" if marked == 1 else "entries"
        lines.append("")
        lines.append(
            f"{UNSTEADY_MARK}: that provider's 20th and 80th percentile run times differ by more than "
            f"{UNSTEADY - 1:.0%} ({marked} {noun}), so its median moves between runs; on short cells, "
            "launches that wait on the host do this."
        )
    return "\n".join(lines)


def write_json(path: Path, results: list[Result], env: dict, providers: list[str]) -> None:
    payload = {
        "environment": env,
        "providers": providers,
        "geomean_ratio": summary(results, providers),
        "results": [r.to_dict() for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))


def write_png(path: Path, results: list[Result], providers: list[str], title: str) -> None:
    """One panel per (dtype, head dim, causal), TFLOP/s against sequence length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.case.dtype, r.case.head_dim, r.case.causal), []).append(r)
    n = len(groups)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, ((dt, d, c), rs) in zip(axes.flat, sorted(groups.items())):
        rs = sorted(rs, key=lambda r: r.case.seqlen)
        for p in providers:
            pts = [(r.case.seqlen, r.tflops[p]) for r in rs if p in r.tflops]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=SHORT.get(p, p), linewidth=2.5 if p == "fa2gen" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dt} D={d} {'causal' if c else 'full'}", fontsize=9)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_json(path: Path) -> tuple[dict, list[str], list[Result]]:
    """(environment, providers, results) from a file written by ``write_json``."""
    data = json.loads(Path(path).read_text())
    results = []
    for row in data["results"]:
        r = Result(Case(**row["case"]), row.get("mode", "fwd"))
        r.tflops, r.ms, r.skipped = row["tflops"], row["ms"], row["skipped"]
        r.max_diff = row.get("max_diff_vs_fa2gen", {})
        results.append(r)
    return data["environment"], data["providers"], results
