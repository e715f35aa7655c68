"""The ``fa2gen`` command line: generate, info, bench."""

from __future__ import annotations

import os
import sys
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


def _knob_values(texts: list[str]) -> dict:
    """--knob NAME=VALUE options as keyword values (integers where the text is one); whether
    each names a declared knob and one of its values is TuningParams' to say."""
    values = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected NAME=VALUE, got {text!r}", param_hint="--knob")
        values[name] = int(value) if value.lstrip("-").isdigit() else value
    return values


@app.command()
def generate(
    direction: Annotated[
        str, typer.Option(help="fwd, bwd (delta, dK/dV and dQ kernels), or decode (over a KV cache)")
    ] = "fwd",
    dtype: Annotated[str, typer.Option(help="fp16, bf16, or fp8e4m3 (fwd only)")] = "fp16",
    head_dim: Annotated[int, typer.Option(help="multiple of 8 in [16, 256]")] = 64,
    mask: Annotated[str, typer.Option(help="none, causal or local")] = "none",
    softcap: Annotated[bool, typer.Option(help="score soft-capping")] = False,
    paged: Annotated[bool, typer.Option(help="decode only: a paged KV cache")] = False,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    loads: Annotated[str, typer.Option(help="pointer, tma_host, or tma_device (fwd only)")] = "pointer",
    dq_mode: Annotated[
        str,
        typer.Option(
            help="bwd only: separate (own dQ kernel), atomic (with --gluon 1: the one-pass Gluon kernel, "
            "--block-m 128 --block-n 64 --num-warps 8), tma_reduce (needs --loads tma_host), or matmul "
            "(over the dS the Gluon dK/dV kernel stores; needs --gluon 1)"
        ),
    ] = "separate",
    persistent: Annotated[
        int,
        typer.Option(
            help="fwd only: 0 (one program per tile), or 1, 2 or 3 programs per SM walking the tiles "
            "(3: the one-partition Gluon form, --gluon 1 --block-m 64, at head dim 64)"
        ),
    ] = 0,
    gluon: Annotated[
        int,
        typer.Option(
            help="sm90: 0 (the Triton template); fwd: 1 or 2 compute partitions of the warp-specialised "
            "Gluon forward (with --loads tma_host, --num-warps block_m/16); bwd: 1, the Gluon dK/dV "
            "kernel, 2, the Gluon dK/dV and dQ kernels (with --loads tma_host)"
        ),
    ] = 0,
    knob: Annotated[
        Optional[list[str]],
        typer.Option(
            help="NAME=VALUE: a knob a template declares beyond the options above (descriptors.Knob), "
            "repeatable; `fa2gen info` lists them"
        ),
    ] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write to a file instead of stdout")] = None,
    compile_for: Annotated[
        Optional[str],
        typer.Option(
            help="instead of the source, compile for this arch (e.g. sm90; no GPU needed) and print "
            "each kernel's registers, spills and shared memory"
        ),
    ] = None,
) -> None:
    """Print the rendered Triton (or Gluon) source of one kernel variant."""
    from .generator import KernelSpec, SpecError, TuningParams, Variant, render

    try:
        spec = KernelSpec(direction=direction, dtype=dtype, head_dim=head_dim, mask=mask, softcap=softcap, paged=paged)
        params = TuningParams(
            block_m=block_m,
            block_n=block_n,
            num_warps=num_warps,
            num_stages=num_stages,
            loads=loads,
            dq_mode=dq_mode,
            persistent=persistent,
            gluon=gluon,
        ).replace(**_knob_values(knob or []))
        variant = Variant(spec, params)
        source = render(spec, params, name=variant.name)
    except SpecError as e:
        raise typer.BadParameter(str(e)) from None
    if compile_for:
        _compile_ahead(spec, params, compile_for)
        return
    if output:
        output.write_text(source)
        typer.echo(f"wrote {variant.name} to {output}", err=True)
    else:
        typer.echo(source, nl=False)


def _compile_ahead(spec, params, arch: str) -> None:
    from .generator.ahead import compile_for
    from .generator.arch import ARCHES
    from .generator.cache import interpreting

    if arch not in ARCHES:
        raise typer.BadParameter(f"choose from {', '.join(ARCHES)}", param_hint="--compile-for")
    if interpreting():
        raise typer.BadParameter("compiling needs TRITON_INTERPRET unset", param_hint="--compile-for")
    try:
        found = compile_for(spec, params, arch)
    except Exception as e:  # the compiler's verdict is the answer
        typer.echo(f"{arch}: compile failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}", err=True)
        raise typer.Exit(1)
    for name, r in found.items():
        typer.echo(f"{name} ({arch}): {r.registers} registers, {r.spill_bytes} B spilled, {r.shared_bytes} B shared")
        for loss in r.losses:
            typer.echo(f"  ptxas {loss}")


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
    from .generator.descriptors import template_knobs
    from .paths import kernel_cache_dir
    from .runtime.device import cuda_device_info
    from .runtime.dispatch import explain
    from .runtime.problem import make_problem
    from .store.db import default_db_path
    from .store.shipped import shipped_root

    typer.echo(f"fa2gen {__version__}  torch {torch.__version__}  triton {triton.__version__}")
    typer.echo(f"kernel cache: {kernel_cache_dir()}")
    typer.echo(f"tuned database: {default_db_path()}")
    typer.echo(f"shipped configs: {shipped_root()}")
    knobs = template_knobs()
    typer.echo(
        "template knobs: "
        + (
            "none"
            if not knobs
            else "; ".join(f"{n} {k.values} default {k.default!r} ({t.file})" for n, (k, t) in knobs.items())
        )
    )
    dev = None
    if torch.cuda.is_available():
        dev = cuda_device_info(torch.cuda.current_device())
        typer.echo(
            f"GPU: {torch.cuda.get_device_name()} ({dev.name}), cc {dev.capability[0]}.{dev.capability[1]}, "
            f"arch {dev.arch}, {dev.sm_count} SMs"
        )
    else:
        where = (
            "Triton interpreter"
            if interpreting()
            else "PyTorch reference path (set TRITON_INTERPRET=1 for the interpreter)"
        )
        typer.echo(f"GPU: none; CPU tensors run on the {where}")
    from .runtime.problem import TORCH_DTYPES

    if dtype not in TORCH_DTYPES:
        raise typer.BadParameter(", ".join(TORCH_DTYPES), param_hint="--dtype")
    tdtype = TORCH_DTYPES[dtype]
    hk, nk = kv_heads or heads, seqlen_k or seqlen_q
    try:
        # meta tensors: validation and dispatch without allocating anything
        q = torch.empty(batch, heads, seqlen_q, head_dim, dtype=tdtype, device="meta")
        k = torch.empty(batch, hk, nk, head_dim, dtype=tdtype, device="meta")
        problem = make_problem(q, k, k, causal=causal)
    except (TypeError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    typer.echo(f"shape: B={batch} Hq={heads} Hkv={hk} Nq={seqlen_q} Nk={nk} D={head_dim} {dtype} mask={problem.mask}")
    if dev is None and not interpreting():
        typer.echo("config: none (no kernel runs on the reference path)")
        return
    directions = (("fwd", "config"),) if problem.kernel_spec().fp8 else (("fwd", "config"), ("bwd", "backward config"))
    for direction, label in directions:
        choice = explain(problem, dev, direction)
        tuned_for = f", tuned for {choice.bucket.key}" if choice.bucket else ""
        tuned_for += f" under triton {choice.triton}" if choice.triton else ""
        typer.echo(
            f"{label} ({dev.arch if dev else 'cpu'}, from {choice.source}{tuned_for}): {choice.params.to_dict()}"
        )


@app.command()
def bench(
    shapes: Annotated[Optional[str], typer.Option(help='custom shapes "B,H,N,D;..." or "B,H,Hkv,Nq,Nk,D;..."')] = None,
    dtypes: Annotated[str, typer.Option(help="comma-separated: fp16,bf16,fp8e4m3 (fp8: forward only)")] = "fp16,bf16",
    head_dims: Annotated[str, typer.Option(help="canonical grid head dims")] = "64,128",
    seqlens: Annotated[str, typer.Option(help="canonical grid sequence lengths")] = "512,1024,2048,4096,8192,16384",
    causal: Annotated[str, typer.Option(help="off, on or both")] = "both",
    providers: Annotated[
        Optional[str], typer.Option(help="fa2gen,sdpa-cudnn,sdpa-flash,sdpa-efficient,flex,sdpa-math")
    ] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write results as JSON")] = None,
    png: Annotated[Optional[Path], typer.Option(help="draw a chart (needs matplotlib)")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="write the table as Markdown")] = None,
    mode: Annotated[str, typer.Option(help="fwd, bwd (the backward alone) or fwd+bwd")] = "fwd",
    seed: int = 0,
) -> None:
    """Time fa2gen side by side with SDPA's backends and compiled FlexAttention.

    TFLOP/s count the forward as 4·B·H·Nq·Nk·D (half when causal and square), the backward
    as 2.5 times that.

    Without a GPU it runs a small CPU grid through Triton's interpreter (a smoke run,
    not a measurement of anything a GPU would do).
    """
    import torch

    from .bench import grid as G
    from .bench.providers import CPU_DEFAULT, GPU_DEFAULT, PROVIDERS

    if png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise typer.BadParameter(
                "drawing a chart needs matplotlib (pip install 'fa2gen[plot]')", param_hint="--png"
            ) from None
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        # Must be set before any generated module is imported in this process.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if on_gpu else "cpu")
    from .bench.runner import MODES

    if mode not in MODES:
        raise typer.BadParameter(f"choose from {', '.join(MODES)}", param_hint="--mode")
    dts = _choices(dtypes, tuple(G.DTYPES), "--dtypes")
    causals = {"off": [False], "on": [True], "both": [False, True]}.get(causal)
    if causals is None:
        raise typer.BadParameter("off, on or both", param_hint="--causal")
    if mode != "fwd" and any(d.startswith("fp8") for d in dts):
        raise typer.BadParameter("fp8 is forward only: use --mode fwd", param_hint="--dtypes")
    names = (
        _choices(providers, tuple(PROVIDERS), "--providers")
        if providers
        else list(GPU_DEFAULT if on_gpu else CPU_DEFAULT)
    )
    if "fa2gen" not in names:
        names.insert(0, "fa2gen")
    if not providers and any(d.startswith("fp8") for d in dts):
        names.insert(1, "fa2gen-bf16")
    if shapes:
        try:
            cases = G.parse_shapes(shapes, dtypes=dts, causals=causals)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--shapes") from None
    elif on_gpu:
        cases = G.canonical_grid(
            dtypes=dts, head_dims=_ints(head_dims, "--head-dims"), seqlens=_ints(seqlens, "--seqlens"), causals=causals
        )
    else:
        typer.echo(
            "no GPU: running the CPU smoke grid (D=64, N=64 and 128) under Triton's interpreter; "
            "--head-dims and --seqlens apply on a GPU only",
            err=True,
        )
        cases = G.cpu_smoke_grid(dtypes=dts, causals=causals)
    _run_bench(cases, names, device, seed, json_out, png, markdown_out, mode)


def _run_bench(cases, names, device, seed, json_out, png, markdown_out, mode) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .bench import report
    from .bench.runner import environment, run_case

    # Piped output (logs, CI) gets a wide fixed width so the ratio table does not wrap.
    console = Console(width=None if sys.stdout.isatty() else 200)
    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("bench", total=len(cases))
        for case in cases:
            progress.update(task, description=case.label())
            results.append(run_case(case, names, device, seed=seed, mode=mode))
            if json_out:  # after every case, so that a run cut short keeps what it measured
                report.write_json(json_out, results, environment(device), names)
            progress.advance(task)
    header, rows = report.ratio_rows(results, names)
    table = Table(title=f"TFLOP/s ({mode}) on {environment(device)['device']}; xNAME = fa2gen / NAME")
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
        report.write_png(png, results, names, f"fa2gen {mode} on {env['device']}")


@app.command()
def tune(
    arch: Annotated[str, typer.Option(help="search space and output naming: sm80, sm86, sm89 or sm90")],
    grid: Annotated[Optional[Path], typer.Option(help="YAML file of problems to tune (default: built-in grid)")] = None,
    directions: Annotated[
        Optional[str],
        typer.Option(
            help="fwd, bwd, decode, or several, comma-separated (default: fwd for the built-in grid, every "
            "direction of a --grid file)"
        ),
    ] = None,
    trials: Annotated[
        int,
        typer.Option(
            help="finished trials per bucket: measured, or rejected by the compiler or the "
            "correctness check (points the static rules prune cost nothing)"
        ),
    ] = 40,
    time_budget: Annotated[Optional[float], typer.Option(help="stop after this many seconds in all")] = None,
    db: Annotated[Optional[Path], typer.Option(help="results database (default: FA2GEN_DB or the user cache)")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL for the studies")] = None,
    sampler: Annotated[str, typer.Option(help="tpe, or brute (exhaustive) for small spaces")] = "tpe",
    resume: Annotated[bool, typer.Option(help="continue existing studies (--no-resume starts them over)")] = True,
    seed: int = 0,
    workers: Annotated[Optional[int], typer.Option(help="parallel compile processes")] = None,
    limit: Annotated[Optional[int], typer.Option(help="tune only the first N buckets of the grid")] = None,
    untuned: Annotated[
        bool,
        typer.Option(
            help="tune only the buckets with no entry for this GPU, Triton and template (after a template change: "
            "those the carried-over entries leave)"
        ),
    ] = False,
) -> None:
    """Search the fastest correct config per problem bucket on the local GPU."""
    import torch

    from .runtime.device import cuda_device_info
    from .tuner.space import SPACES

    if arch not in SPACES:
        raise typer.BadParameter(f"choose from {', '.join(SPACES)}", param_hint="--arch")
    _check_tune_options(trials, time_budget, sampler, workers, limit)
    _directions(directions)
    if not torch.cuda.is_available():
        typer.echo("fa2gen tune: no CUDA GPU found; tuning needs the GPU it tunes for", err=True)
        raise typer.Exit(2)
    dev = cuda_device_info(torch.cuda.current_device())
    if dev.arch != arch:
        typer.echo(f"fa2gen tune: this GPU ({dev.name}) is {dev.arch}, not {arch}", err=True)
        raise typer.Exit(2)
    from .tuner.evaluate import DeviceFault, GpuEvaluator

    evaluator = GpuEvaluator(workers=workers, seed=seed)
    try:
        _run_tune(
            arch,
            dev,
            evaluator,
            grid,
            trials,
            time_budget,
            db,
            storage,
            sampler,
            resume,
            seed,
            limit,
            directions,
            untuned,
        )
    except DeviceFault as e:
        typer.echo(
            f"fa2gen tune: stopped, the GPU context is unusable after a faulty candidate ({e}); "
            "run the same command again to resume",
            err=True,
        )
        raise typer.Exit(3)
    finally:
        evaluator.close()


def _check_tune_options(trials, time_budget, sampler, workers, limit) -> None:
    """Reject bad options before anything is opened, let alone deleted."""
    if trials < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--trials")
    if time_budget is not None and not time_budget > 0:
        raise typer.BadParameter("must be > 0 seconds", param_hint="--time-budget")
    if sampler not in ("tpe", "brute"):
        raise typer.BadParameter("tpe or brute", param_hint="--sampler")
    if workers is not None and workers < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--workers")
    if limit is not None and limit < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--limit")


def _directions(text: str | None) -> tuple[str, ...] | None:
    from .generator.spec import DIRECTIONS

    return tuple(_choices(text, DIRECTIONS, "--directions")) if text else None


def _run_tune(
    arch,
    dev,
    evaluator,
    grid,
    trials,
    time_budget,
    db,
    storage,
    sampler,
    resume,
    seed,
    limit,
    directions=None,
    untuned=False,
) -> None:
    """The body of ``fa2gen tune`` after the GPU checks (CPU tests drive it with a cost model)."""
    import optuna
    import triton
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .runtime.dispatch import clear_memo
    from .store.db import TunedDB
    from .store.records import Validity
    from .tuner.grid import GridError, default_buckets, read_grid
    from .tuner.run import TuneOptions, open_storage
    from .tuner.run import tune as run_tune
    from .tuner.space import space_for

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar and table report instead
    wanted = _directions(directions)
    try:
        buckets = read_grid(grid) if grid else default_buckets(wanted or ("fwd",))
    except GridError as e:
        raise typer.BadParameter(str(e), param_hint="--grid") from None
    if wanted:
        buckets = [b for b in buckets if b.direction in wanted]
    _check_tune_options(trials, time_budget, sampler, None, limit)
    results_db = TunedDB(db)
    storage_url = storage or f"sqlite:///{results_db.path.with_name(results_db.path.stem + '-studies.sqlite')}"
    cap = f"{dev.capability[0]}.{dev.capability[1]}"

    def validity_for(bucket):
        return Validity(dev.name, cap, triton.__version__)

    if untuned:
        buckets = [b for b in buckets if results_db.get(validity_for(b), b) is None]
    if limit is not None:
        buckets = buckets[:limit]

    console = Console(width=None if sys.stdout.isatty() else 200)
    state = {"bucket": None}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("tune", total=len(buckets) * trials)

        def on_bucket_start(i, bucket):
            state["bucket"] = (i, bucket)
            progress.update(task, completed=i * trials, description=f"[{i + 1}/{len(buckets)}] {bucket.key}")

        def on_progress(done, best):
            i, bucket = state["bucket"]
            best_txt = f" best {best:.4f} ms" if best is not None else ""
            progress.update(
                task,
                completed=i * trials + min(done, trials),
                description=f"[{i + 1}/{len(buckets)}] {bucket.key}{best_txt}",
            )

        results = run_tune(
            buckets,
            evaluator,
            space_for(arch),
            db=results_db,
            storage=open_storage(storage_url),
            validity_for=validity_for,
            options=TuneOptions(trials=trials, time_budget_s=time_budget, sampler=sampler, seed=seed, resume=resume),
            on_bucket_start=on_bucket_start,
            on_progress=on_progress,
        )
    clear_memo()
    table = Table(title=f"fa2gen tune --arch {arch} on {dev.name}: {len(results)} of {len(buckets)} buckets")
    for col in ("bucket", "best config", "TFLOP/s", "vs default", "max error", "trials"):
        table.add_column(col, justify="left" if col in ("bucket", "best config") else "right")
    for r in results:
        if r.best is None:
            table.add_row(r.bucket.key, "no correct candidate", "-", "-", "-", str(r.trials))
            continue
        p = r.best
        speed = f"{r.default_ms / r.measurement.median_ms:.2f}x" if r.default_ms else "-"
        table.add_row(
            r.bucket.key,
            p.label(),
            f"{r.measurement.tflops:.0f}",
            speed,
            f"{r.measurement.max_error:.1e}",
            str(r.trials),
        )
    console.print(table)
    console.print(f"results: {results_db.path}; studies: {storage_url}")


@app.command()
def show(
    db: Annotated[Optional[Path], typer.Option(help="results database")] = None,
    arch: Annotated[Optional[str], typer.Option(help="only this arch")] = None,
    device: Annotated[Optional[str], typer.Option(help="only this normalised device name")] = None,
) -> None:
    """List the tuned entries in the results database."""
    from rich.console import Console
    from rich.table import Table

    store = _read_db(db, "show", missing_ok=True)
    if store is None:
        typer.echo("0 entries")
        return
    table = Table(title=str(store.path))
    # code: "current" while the params render to the code they were measured on, else "changed"
    # (the lookup skips the entry until its bucket is tuned again)
    for col in ("device", "arch", "triton", "bucket", "config", "code", "ms", "TFLOP/s", "speedup", "trials"):
        table.add_column(col)
    n = 0
    for e in _db_entries(store, "show", device=device):
        a = e.validity.arch
        if arch and a != arch:
            continue
        p = e.params
        table.add_row(
            e.validity.device,
            a,
            e.validity.triton,
            e.bucket.key,
            p.label(),
            "current" if e.current else "changed",
            f"{e.measurement.median_ms:.4f}",
            f"{e.measurement.tflops:.0f}",
            f"{e.speedup:.2f}x" if e.speedup else "-",
            str(e.trials),
        )
        n += 1
    Console(width=None if sys.stdout.isatty() else 220).print(table)
    typer.echo(f"{n} entries")


@app.command("export")
def export_(
    arch: Annotated[str, typer.Option(help="arch of the entries to export")],
    output: Annotated[Path, typer.Option("--output", "-o", help="YAML file to write")],
    device: Annotated[Optional[str], typer.Option(help="device to export (needed if the DB has several)")] = None,
    triton_version: Annotated[
        Optional[str], typer.Option("--triton", help="Triton version (default: installed)")
    ] = None,
    torch_version: Annotated[
        Optional[str],
        typer.Option(
            "--torch",
            help="torch version recorded in the file (default: installed; give the tuning machine's "
            "when exporting elsewhere)",
        ),
    ] = None,
    db: Annotated[Optional[Path], typer.Option(help="results database")] = None,
) -> None:
    """Write tuned entries of one device as a tuned-config YAML file.

    Only entries tuned under the chosen Triton version whose params still render to the code
    they were measured on are exported: those are the ones a run-time lookup would use.
    """
    import torch
    import triton

    from . import __version__
    from .store.records import RecordError
    from .store.yamlfile import dump

    store = _read_db(db, "export")
    version = triton_version or triton.__version__
    candidates = [e for e in _db_entries(store, "export", device=device) if e.validity.arch == arch]
    entries = [e for e in candidates if e.validity.triton == version and e.current]
    if not entries:
        skipped = f" ({len(candidates)} tuned under another Triton or on changed code)" if candidates else ""
        typer.echo(f"fa2gen export: no {arch} entries for triton {version} in {store.path}{skipped}", err=True)
        raise typer.Exit(1)
    devices = sorted({(e.validity.device, e.validity.capability) for e in entries})
    if len(devices) > 1:
        listed = ", ".join(f"{d} (cc {c})" for d, c in devices)
        typer.echo(f"fa2gen export: entries for several devices: {listed}; pick one with --device", err=True)
        raise typer.Exit(1)
    try:
        text = dump(entries, arch=arch, fa2gen_version=__version__, torch_version=torch_version or torch.__version__)
    except RecordError as e:
        typer.echo(f"fa2gen export: {e}", err=True)
        raise typer.Exit(1)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    typer.echo(f"wrote {len(entries)} entries to {output}")


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="tuned-config YAML file")],
    db: Annotated[Optional[Path], typer.Option(help="results database")] = None,
) -> None:
    """Load a tuned-config YAML file into the results database, validating every value."""
    from .runtime.dispatch import clear_memo
    from .store.db import TunedDB
    from .store.records import RecordError
    from .store.yamlfile import read

    try:
        cfg = read(file)
    except RecordError as e:
        typer.echo(f"fa2gen import: {file}: {e}", err=True)
        raise typer.Exit(1)
    try:
        store = TunedDB(db)
        store.put(cfg.entries)
    except _db_errors() as e:
        typer.echo(f"fa2gen import: {_one_line(e)}", err=True)
        raise typer.Exit(1)
    clear_memo()
    typer.echo(f"imported {len(cfg.entries)} entries for {cfg.meta['device']} into {store.path}")


def _db_errors() -> tuple:
    """What a broken database file raises: fa2gen's StoreError, the OS's, SQLite's and
    SQLAlchemy's errors (imported here, not at start-up)."""
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    from .store.db import StoreError

    return (StoreError, OSError, sqlite3.Error, SQLAlchemyError)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


def _read_db(db: Optional[Path], command: str, *, missing_ok: bool = False):
    """The results database opened read-only (nothing written, created or converted: a
    read-only command leaves any file it is pointed at as it was), or None where there is none
    and ``missing_ok``; a file that is not a readable fa2gen database exits with one line."""
    from .store.db import TunedDB, default_db_path

    path = db if db is not None else default_db_path()
    if not path.exists():
        if missing_ok:
            typer.echo(f"no tuned database at {path}")
            return None
        typer.echo(f"fa2gen {command}: no tuned database at {path}", err=True)
        raise typer.Exit(1)
    if not path.is_file():
        typer.echo(f"fa2gen {command}: {path} is not a database file", err=True)
        raise typer.Exit(1)
    try:
        return TunedDB(path, readonly=True)
    except _db_errors() as e:
        typer.echo(f"fa2gen {command}: {_one_line(e)}", err=True)
        raise typer.Exit(1)


def _db_entries(store, command: str, **filters) -> list:
    """``store``'s valid entries, or one line and exit where the file breaks while read."""
    try:
        return list(store.entries(**filters))
    except _db_errors() as e:
        typer.echo(f"fa2gen {command}: {store.path}: {_one_line(e)}", err=True)
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
