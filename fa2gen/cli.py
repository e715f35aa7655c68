"""The ``fa2gen`` command line: generate, info, bench."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Generated, tuned Triton FlashAttention-2 kernels.")


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=option) from None
    if not values:
        raise typer.BadParameter("expected at least one value", param_hint=option)
    return values


def _choices(text: str, allowed, option: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in values if x not in allowed]
    if bad or not values:
        raise typer.BadParameter(f"choose from {', '.join(allowed)}; got {text!r}", param_hint=option)
    return values


@app.command()
def generate(
    direction: Annotated[str, typer.Option(help="kernel direction")] = "fwd",
    dtype: Annotated[str, typer.Option(help="fp16 or bf16")] = "fp16",
    head_dim: Annotated[int, typer.Option(help="multiple of 8 in [16, 256]")] = 64,
    mask: Annotated[str, typer.Option(help="none, causal or local")] = "none",
    softcap: Annotated[bool, typer.Option(help="score soft-capping")] = False,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    loads: Annotated[str, typer.Option(help="pointer or tma")] = "pointer",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write to a file instead of stdout")] = None,
) -> None:
    """Print the rendered Triton source of one kernel variant."""
    from .generator import KernelSpec, SpecError, TuningParams, Variant, render

    try:
        spec = KernelSpec(direction=direction, dtype=dtype, head_dim=head_dim, mask=mask, softcap=softcap)
        params = TuningParams(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages, loads=loads)
    except SpecError as e:
        raise typer.BadParameter(str(e)) from None
    variant = Variant(spec, params)
    source = render(spec, params, name=variant.name)
    if output:
        output.write_text(source)
        typer.echo(f"wrote {variant.name} to {output}", err=True)
    else:
        typer.echo(source, nl=False)


@app.command()
def info(
    batch: int = 4,
    heads: int = 16,
    kv_heads: Annotated[Optional[int], typer.Option(help="k/v heads (GQA); default = heads")] = None,
    seqlen_q: int = 4096,
    seqlen_k: Annotated[Optional[int], typer.Option(help="default = seqlen-q")] = None,
    head_dim: int = 128,
    dtype: str = "fp16",
    causal: bool = False,
) -> None:
    """Show the GPU, versions, cache locations and the config a shape would use."""
    import torch
    import triton

    from . import __version__
    from .generator.cache import interpreting
    from .paths import kernel_cache_dir
    from .runtime.device import cuda_device_info
    from .runtime.dispatch import select_params
    from .runtime.problem import make_problem

    typer.echo(f"fa2gen {__version__}  torch {torch.__version__}  triton {triton.__version__}")
    typer.echo(f"kernel cache: {kernel_cache_dir()}")
    if torch.cuda.is_available():
        dev = cuda_device_info(torch.cuda.current_device())
        typer.echo(f"GPU: {torch.cuda.get_device_name()} ({dev.name}), cc {dev.capability[0]}.{dev.capability[1]}, "
                   f"arch {dev.arch}, {dev.sm_count} SMs")
        arch, where = dev.arch, "cuda"
    else:
        arch = "cpu"
        where = "Triton interpreter" if interpreting() else "PyTorch reference path (set TRITON_INTERPRET=1 for the interpreter)"
        typer.echo(f"GPU: none; CPU tensors run on the {where}")
    if dtype not in ("fp16", "bf16"):
        raise typer.BadParameter("fp16 or bf16", param_hint="--dtype")
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    hk, nk = kv_heads or heads, seqlen_k or seqlen_q
    try:
        # meta tensors: validation and dispatch without allocating anything
        q = torch.empty(batch, heads, seqlen_q, head_dim, dtype=tdtype, device="meta")
        k = torch.empty(batch, hk, nk, head_dim, dtype=tdtype, device="meta")
        problem = make_problem(q, k, k, causal=causal)
    except (TypeError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    params = select_params(problem, arch)
    typer.echo(f"shape: B={batch} Hq={heads} Hkv={hk} Nq={seqlen_q} Nk={nk} D={head_dim} {dtype} mask={problem.mask}")
    typer.echo(f"config ({arch}, heuristic default): {params.to_dict()}")


@app.command()
def bench(
    shapes: Annotated[Optional[str], typer.Option(help='custom shapes "B,H,N,D;..." or "B,H,Hkv,Nq,Nk,D;..."')] = None,
    dtypes: Annotated[str, typer.Option(help="comma-separated: fp16,bf16")] = "fp16,bf16",
    head_dims: Annotated[str, typer.Option(help="canonical grid head dims")] = "64,128",
    seqlens: Annotated[str, typer.Option(help="canonical grid sequence lengths")] = "512,1024,2048,4096,8192,16384",
    causal: Annotated[str, typer.Option(help="off, on or both")] = "both",
    providers: Annotated[Optional[str], typer.Option(help="fa2gen,sdpa-cudnn,sdpa-flash,sdpa-efficient,flex,sdpa-math")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write results as JSON")] = None,
    png: Annotated[Optional[Path], typer.Option(help="draw a chart (needs matplotlib)")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="write the table as Markdown")] = None,
    seed: int = 0,
) -> None:
    """Time fa2gen side by side with SDPA's backends and compiled FlexAttention.

    Without a GPU it runs a small CPU grid through Triton's interpreter (a smoke run,
    not a measurement of anything a GPU would do).
    """
    import torch

    from .bench import grid as G
    from .bench.providers import CPU_DEFAULT, GPU_DEFAULT, PROVIDERS

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        # Must be set before any generated module is imported in this process.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if on_gpu else "cpu")
    dts = _choices(dtypes, tuple(G.DTYPES), "--dtypes")
    causals = {"off": [False], "on": [True], "both": [False, True]}.get(causal)
    if causals is None:
        raise typer.BadParameter("off, on or both", param_hint="--causal")
    names = _choices(providers, tuple(PROVIDERS), "--providers") if providers else list(GPU_DEFAULT if on_gpu else CPU_DEFAULT)
    if "fa2gen" not in names:
        names.insert(0, "fa2gen")
    if shapes:
        try:
            cases = G.parse_shapes(shapes, dtypes=dts, causals=causals)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--shapes") from None
    elif on_gpu:
        cases = G.canonical_grid(dtypes=dts, head_dims=_ints(head_dims, "--head-dims"),
                                 seqlens=_ints(seqlens, "--seqlens"), causals=causals)
    else:
        typer.echo("no GPU: running the CPU smoke grid under Triton's interpreter", err=True)
        cases = G.cpu_smoke_grid()
    _run_bench(cases, names, device, seed, json_out, png, markdown_out)


def _run_bench(cases, names, device, seed, json_out, png, markdown_out) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .bench import report
    from .bench.runner import environment, run_case

    import sys

    # Piped output (logs, CI) gets a wide fixed width so the ratio table does not wrap.
    console = Console(width=None if sys.stdout.isatty() else 200)
    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("bench", total=len(cases))
        for case in cases:
            progress.update(task, description=case.label())
            results.append(run_case(case, names, device, seed=seed))
            progress.advance(task)
    header, rows = report.ratio_rows(results, names)
    table = Table(title=f"TFLOP/s (forward) on {environment(device)['device']}; xNAME = fa2gen / NAME")
    for h in header:
        table.add_column(h, justify="left" if h == "case" else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    for p, v in report.summary(results, names).items():
        console.print(f"geomean fa2gen / {p}: {v:.3f}")
    for r in results:
        for p, why in r.skipped.items():
            console.print(f"[dim]{r.case.label()}: {p} skipped: {why}[/dim]")
    env = environment(device)
    if json_out:
        report.write_json(json_out, results, env, names)
    if markdown_out:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(report.markdown(results, names) + "\n")
    if png:
        report.write_png(png, results, names, f"fa2gen forward on {env['device']}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
