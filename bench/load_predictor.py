"""Load predictor comparison: the LSTM against the EWMA (Holt) baseline on load traces.

Each trace (metric-history rows as CSV) is resampled to 5 s, both forecasters are fitted on
the first part and scored walk-forward on the held-out rest: MAE and RMSE of the pending
forecast 30 s ahead, and for bursts (pending reaching --threshold) the lead time and false
alarms. The LSTM is trained once per seed; the table shows medians over seeds. The decision
per trace is `appliance.predict.evaluate.decide`.

    .venv/bin/python bench/load_predictor.py [--regenerate] [--seeds 0,1,2]
        [--markdown docs/load-predictor.md] [TRACE.csv ...]

Without TRACE arguments it runs on tests/data/traces/load_*.csv; --regenerate first writes
those files from the seeded synthetic generator (appliance/predict/synth.py). About 30 s of
CPU on a 2-core box.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from appliance.predict.evaluate import (  # noqa: E402
    BurstSpec,
    DecisionRule,
    EvalResult,
    decide,
    evaluate,
    median_result,
)
from appliance.predict.ewma import EwmaForecaster  # noqa: E402
from appliance.predict.lstm import LstmConfig, LstmForecaster  # noqa: E402
from appliance.predict.runtime import LoadPredictor  # noqa: E402
from appliance.predict.signals import signals_from_history  # noqa: E402
from appliance.predict.synth import SPECS, EngineModel, synth_rows  # noqa: E402
from appliance.predict.traces import read_rows, write_rows  # noqa: E402

TRACE_DIR = ROOT / "tests" / "data" / "traces"
# Not the seed the model settings were tried on (1), so the table is not tuned to its traces.
TRACE_SEED = 7
# Target for the median LSTM predict() (one window, one torch thread): far below a controller
# tick, so refreshing the forecast costs the daemon nothing visible. A timing target belongs
# here, read on a quiet machine, not in a unit test that a loaded machine would fail.
PREDICT_BUDGET_MS = 5.0


@dataclass(frozen=True)
class TraceOutcome:
    """Both forecasters on one trace, and the decision."""

    trace: str
    points: int
    train_points: int
    ewma: EvalResult
    lstm: EvalResult  # median over seeds
    lstm_per_seed: tuple[EvalResult, ...]
    train_s: float  # median LSTM fit time
    epochs: float  # median epochs run
    ewma_alpha: float
    ewma_beta: float
    enabled: bool
    reason: str


def regenerate(trace_dir: Path) -> list[Path]:
    """Write the synthetic traces (seeded) as history-row CSVs."""
    paths = []
    for name, spec in SPECS.items():
        path = trace_dir / f"load_{name}.csv"
        write_rows(path, synth_rows(spec, seed=TRACE_SEED, start_ts_s=1_767_225_600.0))
        paths.append(path)
    return paths


def run_trace(
    path: Path, seeds: Sequence[int], spec: BurstSpec, train_fraction: float, cfg: LstmConfig
) -> tuple[TraceOutcome, LstmForecaster]:
    """Fit and score both forecasters on one trace."""
    series = signals_from_history(read_rows(path), cfg.step_s)
    split_ts = series[int(len(series) * train_fraction)].ts_s
    train = [s for s in series if s.ts_s < split_ts]
    ewma = EwmaForecaster(horizon_s=cfg.horizon_s, step_s=cfg.step_s)
    ewma.fit(train)
    ewma_result = evaluate(ewma, series, split_ts, spec, warmup_steps=cfg.window_steps)
    per_seed, times, epochs, last = [], [], [], None
    for seed in seeds:
        lstm = LstmForecaster(dataclasses.replace(cfg, seed=seed))
        report = lstm.fit(train)
        times.append(report.train_s)
        epochs.append(report.epochs)
        per_seed.append(evaluate(lstm, series, split_ts, spec, warmup_steps=cfg.window_steps))
        last = lstm
    assert last is not None
    lstm_median = median_result(per_seed)
    enabled, reason = decide([ewma_result, lstm_median], DecisionRule())
    name = path.stem.removeprefix("load_")
    return (
        TraceOutcome(
            trace=name,
            points=len(series),
            train_points=len(train),
            ewma=ewma_result,
            lstm=lstm_median,
            lstm_per_seed=tuple(per_seed),
            train_s=statistics.median(times),
            epochs=statistics.median(epochs),
            ewma_alpha=ewma.alpha,
            ewma_beta=ewma.beta,
            enabled=enabled,
            reason=reason,
        ),
        last,
    )


def forecast_latency_ms(path: Path, model: LstmForecaster, calls: int = 200) -> tuple[float, float]:
    """Median and p99 wall time of one controller tick: rows of the last 5 min -> forecast."""
    rows = read_rows(path)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = Path(tmp) / "load_lstm.pt"
        model.save(model_path, meta={"enabled": True, "reason": "bench"})
        predictor = LoadPredictor(model_path, model.horizon_s, model.step_s)
        samples = []
        for i in range(calls):
            end = len(rows) - calls + i
            recent = rows[end - 60 : end]  # 5 min of 5 s rows
            t0 = time.perf_counter()
            fc = predictor.forecast(recent)
            samples.append(1000 * (time.perf_counter() - t0))
            assert fc is not None and fc.source == "lstm", fc
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]


def budget_line(outcomes: Sequence[TraceOutcome]) -> str:
    """The slowest trace's median LSTM predict() against PREDICT_BUDGET_MS."""
    worst = max(outcomes, key=lambda o: o.lstm.predict_ms)
    verdict = "within" if worst.lstm.predict_ms < PREDICT_BUDGET_MS else "OVER"
    return (
        f"LSTM predict(): median {worst.lstm.predict_ms:.3f} ms on the slowest trace "
        f"({worst.trace}), {verdict} the {PREDICT_BUDGET_MS:g} ms budget"
    )


def _lead(r: EvalResult) -> str:
    return "-" if r.median_lead_s is None else f"{r.median_lead_s:+.1f}"


def _note(o: TraceOutcome) -> str:
    if o.enabled and o.lstm.detected == 0:
        return (
            " Enabled on lower error alone: neither forecaster foresaw any of its "
            f"{o.lstm.bursts} threshold crossings, so the LSTM buys accuracy here, not warning."
        )
    return ""


def table(outcomes: Sequence[TraceOutcome]) -> list[str]:
    """The comparison as markdown table lines."""
    lines = [
        "| trace | model | MAE | RMSE | bursts detected | median lead (s) | false alarms "
        "| predict (ms) | LSTM enabled |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        for r in (o.ewma, o.lstm):
            lines.append(
                f"| {o.trace} | {r.name} | {r.mae:.2f} | {r.rmse:.2f} | {r.detected}/{r.bursts} "
                f"| {_lead(r)} | {r.false_alarms} | {r.predict_ms:.3f} "
                f"| {('**yes**' if o.enabled else 'no') if r.name == 'lstm' else ''} |"
            )
    return lines


def seed_lines(outcomes: Sequence[TraceOutcome], seeds: Sequence[int]) -> list[str]:
    """Per-seed LSTM rows, so the spread behind the medians is visible."""
    lines = [
        "| trace | seed | MAE | RMSE | detected | median lead (s) | false alarms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        for seed, r in zip(seeds, o.lstm_per_seed, strict=True):
            lines.append(
                f"| {o.trace} | {seed} | {r.mae:.2f} | {r.rmse:.2f} | {r.detected}/{r.bursts} "
                f"| {_lead(r)} | {r.false_alarms} |"
            )
    return lines


def markdown(
    outcomes: Sequence[TraceOutcome],
    seeds: Sequence[int],
    spec: BurstSpec,
    cfg: LstmConfig,
    train_fraction: float,
    tick_ms: tuple[float, float],
    command: str,
    wall_s: float,
) -> str:
    """docs/load-predictor.md."""
    out = [
        "# Load predictor: LSTM vs EWMA",
        "",
        "The batch controller can raise its concurrency limit before a burst if it knows the "
        "burst is coming. `appliance/predict/` forecasts **pending requests (queued + running) "
        f"{cfg.horizon_s:.0f} s ahead** from the five load signals the daemon stores in its "
        "metric history: GPU utilisation, GPU memory utilisation, core temperature, pending "
        "requests and token throughput. This page compares a small LSTM with an EWMA baseline "
        "and records where the LSTM is shipped enabled.",
        "",
        "Generated by (numbers below are from this run, "
        f"{platform.machine()}, {wall_s:.0f} s wall):",
        "",
        "```",
        command,
        "```",
        "",
        *_traces_md(),
        *_method_md(seeds, spec, cfg, train_fraction),
        *_results_md(outcomes, seeds, tick_ms),
        *_ships_md(outcomes),
    ]
    return "\n".join(out)


def _traces_md() -> list[str]:
    """Where the traces come from and how the toy engine behind them works."""
    eng = EngineModel()
    return [
        "## Traces: all synthetic",
        "",
        "**Every trace here is synthetic.** No recorded load trace with pending requests exists "
        "for this project yet (recording one needs the engine under real traffic for hours); "
        "`tests/data/traces/h100_heat_soak.csv` is synthetic too and carries no request counts, "
        "so it is not used. The traces come from `appliance/predict/synth.py` "
        f"(seed {TRACE_SEED}, 3 h each, one history row per 5 s) and are stored as "
        "`tests/data/traces/load_*.csv` in the metric-history row format "
        "(`ts_s, resolution_s, gpu_util_pct, mem_used_ratio, core_temp_c_max, queued, "
        "in_flight, tokens_per_s`). A recorded export of `GET /admin/history` rows written as "
        "CSV with those columns runs through the same bench: pass its path.",
        "",
        "The generator simulates a toy engine at 1 s steps: Poisson arrivals; at most "
        f"{eng.max_running} running requests (more queue); throughput "
        f"{eng.peak_tokens_per_s:.0f}·r/(r+{eng.half_batch:.0f}) tokens/s for r running, "
        f"{eng.mean_tokens:.0f} tokens per request on average (exponential); GPU utilisation "
        "100·(1-e^(-r/3)) % plus noise; memory 0.5 + 0.45·r/limit; power from utilisation "
        f"({eng.idle_power_w:.0f}-{eng.max_power_w:.0f} W) and temperature a first-order lag "
        f"({eng.thermal_tau_s:.0f} s) towards ambient + {eng.c_per_w} °C/W. Bursts ramp up "
        "linearly, hold, and ramp down, adding arrivals on top of the background:",
        "",
        "| trace | background | bursts |",
        "|---|---|---|",
        "| periodic | 0.6 req/s | every 300 s (±20 s): 60 s ramp to +1.8 req/s, 60 s hold |",
        "| random | 0.6 req/s | Poisson onsets, mean gap 420 s; peak +1.0..2.2 req/s, "
        "ramp 30-90 s, hold 20-90 s |",
        "| mixed | 0.5 req/s ±60 % (3 h sine) | every 600 s (±40 s, 90 s ramp to +1.6 req/s) "
        "plus random ones (mean gap 900 s) |",
        "| steady | 1.2 req/s | none (Poisson noise only: a control) |",
        "",
    ]


def _method_md(
    seeds: Sequence[int], spec: BurstSpec, cfg: LstmConfig, train_fraction: float
) -> list[str]:
    """How both forecasters are fitted and scored, and the rule that enables the LSTM."""
    return [
        "## Method",
        "",
        f"- Resample to a {cfg.step_s:.0f} s grid (`signals_from_history`); fit on the first "
        f"{train_fraction:.0%} of each trace, score on the held-out rest, walking forward: at "
        f"every grid point with {cfg.window_steps} points of history each forecaster gets its "
        f"window (LSTM the last {cfg.window_steps} points, EWMA the last "
        f"{EwmaForecaster().window_steps}) and forecasts pending {cfg.horizon_s:.0f} s later.",
        "- **EWMA** baseline: Holt's linear method (EWMA level + EWMA trend) on pending "
        "requests; alpha and beta are grid-searched on the training part for the lowest MAE at "
        "the horizon (beta 0 is plain EWMA).",
        f"- **LSTM**: 1 layer, hidden {cfg.hidden}, over windows of the five signals, each "
        "z-scored with training statistics (pending as log(1+x)); it predicts the change of "
        f"pending from the last point; Adam lr {cfg.lr}, batch {cfg.batch}, L1 loss, early "
        f"stopping on the latest {cfg.val_fraction:.0%} of the training windows (patience "
        f"{cfg.patience}, at most {cfg.max_epochs} epochs), one torch thread. Trained once per "
        f"seed ({', '.join(map(str, seeds))}); the LSTM rows are medians over the seeds.",
        f"- **Bursts**: pending reaching {spec.threshold:g} (the toy engine's concurrency "
        f"limit, where requests start to queue), re-armed below "
        f"{spec.threshold - spec.hysteresis:g}. An alarm is the forecast crossing the same "
        f"way (by the time the forecast is issued). **Lead time** = burst start minus the "
        f"start of the alarm that is on within [burst - {spec.max_lead_s:.0f} s, burst + "
        f"{spec.late_s:.0f} s], capped at {spec.max_lead_s:.0f} s: positive = warned early; "
        f"persistence scores 0, a perfect {cfg.horizon_s:.0f} s forecast +{cfg.horizon_s:.0f}. "
        "A burst without such an alarm is missed. A **false alarm** is an alarm that matches "
        "no burst and starts while no burst is running.",
        "- **Decision** (`evaluate.decide`, per trace, on the held-out part): the LSTM is "
        f"enabled only if there are at least {DecisionRule().min_bursts} bursts, its MAE is "
        f"at least {DecisionRule().mae_margin:.0%} below EWMA's, it detects no fewer bursts, "
        "its median lead is no shorter, and it raises at most "
        f"{DecisionRule().extra_false_alarms} more false alarm(s). Otherwise EWMA.",
        "",
    ]


def _results_md(
    outcomes: Sequence[TraceOutcome], seeds: Sequence[int], tick_ms: tuple[float, float]
) -> list[str]:
    """The held-out table, training and predict costs, the decisions, the seeds."""
    return [
        "## Results (held-out part)",
        "",
        *table(outcomes),
        "",
        "Training (LSTM, median over seeds): "
        + ", ".join(
            f"{o.trace} {o.train_s:.1f} s / {o.epochs:g} epochs / {o.train_points} points"
            for o in outcomes
        )
        + ". EWMA fit: a grid search, well under 0.1 s. Fitted EWMA (alpha, beta): "
        + ", ".join(f"{o.trace} ({o.ewma_alpha}, {o.ewma_beta})" for o in outcomes)
        + ".",
        "",
        "Predict time: the table's column is the median `predict()` call during the walk "
        "forward. One controller tick through `LoadPredictor.forecast` (60 history rows = "
        f"5 min -> resample -> LSTM forecast) took median {tick_ms[0]:.2f} ms, "
        f"p99 {tick_ms[1]:.2f} ms. {budget_line(outcomes)}.",
        "",
        "Decisions:",
        "",
        *[f"- **{o.trace}**: {o.reason}.{_note(o)}" for o in outcomes],
        "",
        "LSTM per seed:",
        "",
        *seed_lines(outcomes, seeds),
        "",
    ]


def _ships_md(outcomes: Sequence[TraceOutcome]) -> list[str]:
    """Which forecaster each trace gets, how the daemon decides on its own box, the API."""
    enabled = [o.trace for o in outcomes if o.enabled]
    disabled = [o for o in outcomes if not o.enabled]
    return [
        "## What ships",
        "",
        (
            f"The LSTM wins on: {', '.join(enabled)}. "
            if enabled
            else "The LSTM wins on none of these traces. "
        )
        + (
            "It does not win on: "
            + ", ".join(o.trace for o in disabled)
            + "; there the EWMA baseline is the forecaster. "
            if disabled
            else ""
        )
        + "A box does not know which trace it resembles, so the daemon repeats this "
        "comparison on its own history: `train_load_model(rows, path)` fits both on the older "
        "part of the stored metric history, scores them on the newest part with the same rule, "
        "and stores the decision with the model. `load_forecast(rows, path)` then uses the "
        "LSTM only if that decision enabled it (and the model's horizon matches, and 4 min of "
        "recent 5 s history exist); otherwise it returns the EWMA forecast, with the reason.",
        "",
        "## API for the controller",
        "",
        "```python",
        "from appliance.predict.runtime import load_forecast, train_load_model",
        "",
        "# every tick: rows = the last ~5 min of metric-history rows (GET /admin/history shape)",
        "fc = load_forecast(rows, model_path)  # LoadForecast | None (None: no rows)",
        "fc.pending_expected  # queued + running expected fc.horizon_s (30 s) after fc.ts_s",
        "fc.pending_now, fc.source ('lstm' | 'ewma'), fc.reason",
        "",
        "# now and then, off the event loop (seconds of CPU): train and decide on this box",
        "report = train_load_model(day_of_rows, model_path, burst_threshold=ceiling)",
        "```",
        "",
        "torch is imported only when a model is trained or loaded (it ships with the vLLM "
        "engine extras); without it, or without a model, `load_forecast` answers from EWMA.",
        "",
        "Limits: the traces are synthetic and their bursts are generated by the same process "
        "in the training and the held-out part, which favours a learnt model over a fixed "
        "formula; a real box's history may be less regular. The model settings were tried on "
        f"traces of another seed (1), not on these (seed {TRACE_SEED}).",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, print the table, optionally write the markdown and JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path, help="history-row CSVs")
    ap.add_argument("--regenerate", action="store_true", help="rewrite the synthetic traces")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="LSTM training seeds")
    ap.add_argument("--train-fraction", type=float, default=0.6)
    ap.add_argument("--threshold", type=float, default=16.0, help="pending count of a burst")
    ap.add_argument("--hysteresis", type=float, default=6.0)
    ap.add_argument("--markdown", type=Path, help="write the report here")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    paths = list(args.traces)
    if args.regenerate:
        paths = paths or regenerate(TRACE_DIR)
    if not paths:
        paths = sorted(TRACE_DIR.glob("load_*.csv"))
    if not paths:
        print("no traces: pass CSVs or --regenerate", file=sys.stderr)
        return 2
    cfg = LstmConfig()
    spec = BurstSpec(
        threshold=args.threshold,
        hysteresis=args.hysteresis,
        max_lead_s=4 * cfg.horizon_s,
        late_s=cfg.horizon_s,
    )
    outcomes, last_model = [], None
    for path in paths:
        outcome, last_model = run_trace(path, seeds, spec, args.train_fraction, cfg)
        outcomes.append(outcome)
        print(f"{outcome.trace}: {outcome.reason}", flush=True)
    assert last_model is not None
    tick_ms = forecast_latency_ms(paths[0], last_model)
    print("\n".join(table(outcomes)))
    print(f"controller tick (rows -> forecast): median {tick_ms[0]:.2f} ms, p99 {tick_ms[1]:.2f}")
    print(budget_line(outcomes))
    wall_s = time.perf_counter() - started
    command = ".venv/bin/python bench/load_predictor.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    if args.markdown:
        args.markdown.write_text(
            markdown(outcomes, seeds, spec, cfg, args.train_fraction, tick_ms, command, wall_s)
        )
    if args.json_out:
        args.json_out.write_text(
            json.dumps([dataclasses.asdict(o) for o in outcomes], indent=2, default=str)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
