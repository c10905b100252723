"""wmtp/plots.py draws what a metrics file says: small literal metrics files of every kind that
``render`` knows, their figures read back panel by panel (each line's points, label, style and colour,
each bar's place, height and whiskers, the titles and scales), not just a PNG that exists. The
figures are caught where ``_finish`` gets them and not saved, but in the one test of ``_finish``
itself (the command-line tests write the PNGs of real runs)."""

import json

import pytest

from wmtp import plots

ENV = {"device": "cpu", "device_name": "Test CPU", "versions": {"torch": "9.9"}}


@pytest.fixture
def drawn(monkeypatch):
    """``render(metrics)`` for a metrics dict, returning its figure's ``(fig, axes, title)`` as
    ``_finish`` gets them (nothing saved)."""
    got = []
    monkeypatch.setattr(plots, "_finish", lambda fig, axes, title, png: got.append((fig, list(axes), title)))

    def render(m, tmp_path):
        (tmp_path / "m.json").write_text(json.dumps(m))
        assert plots.render(tmp_path / "m.json") == tmp_path / "m.png" and len(got) == 1
        return got.pop()

    return render


def _lines(ax):
    """``{label: (xs, ys)}`` of the panel's lines, in drawing order."""
    return {ln.get_label(): ([float(x) for x in ln.get_xdata()], [float(y) for y in ln.get_ydata()])
            for ln in ax.get_lines()}


def _styles(ax):
    return {ln.get_label(): (ln.get_linestyle(), ln.get_color()) for ln in ax.get_lines()}


def _bars(ax):
    """``{label: [(x, height, (low, high) or None), ...]}`` of the panel's bar series (whiskers' ends)."""
    from matplotlib.container import BarContainer

    out = {}
    for c in (c for c in ax.containers if isinstance(c, BarContainer)):  # (bar's whiskers: an ErrorbarContainer)
        whiskers = [None] * len(c.patches)
        if c.errorbar is not None:
            whiskers = [(float(s[0][1]), float(s[1][1])) for s in c.errorbar.lines[2][0].get_segments()]
        out[c.get_label()] = [(round(p.get_x() + p.get_width() / 2, 9), round(p.get_height(), 9), w)
                              for p, w in zip(c.patches, whiskers)]
    return out


DRAFT_ROWS = [{"keyset": "native", "context": 256, "median_s": 0.004}, {"keyset": "sink4+win8", "context": 64,
              "median_s": 0.001}, {"keyset": "native", "context": 64, "median_s": 0.002},
              {"keyset": "sink4+win8", "context": 256, "median_s": 0.0015}]  # contexts out of order


def test_draft_attention_is_ms_against_context_per_key_set(drawn, tmp_path):
    fig, (ax,), title = drawn({"kind": "draft-attention", "environment": ENV, "dtype": "float32",
                                "rows": DRAFT_ROWS}, tmp_path)
    assert _lines(ax) == {"native": ([64, 256], [2.0, 4.0]), "sink4+win8": ([64, 256], [1.0, 1.5])}
    assert (ax.get_xscale(), ax.get_yscale(), ax.get_title()) == ("log", "log", "Draft attention alone")
    assert title == "wmtp bench attention (cpu, torch 9.9, float32)"


def _arm(draft_ms, verify_ms, al):
    return {"draft_time_per_step_s": draft_ms / 1e3, "verify_time_per_step_s": verify_ms / 1e3,
            "mean_accept_length": al}


def test_a_reproduction_is_draft_attention_step_times_and_acceptance(drawn, tmp_path):
    """Per arm the draft (solid) and verify (dashed) ms per step in one colour, and the AL."""
    m = {"draft_attention": DRAFT_ROWS, "config": {"preset": "tiny", "spec": {"depth": 3}},
         "corpus": {"name": "wikitext-2"},
         "environment": ENV, "decode_dtype": "float64",
         "contexts": [{"context": 64, "arms": {"native": _arm(1, 4, 2.5), "sink4+win8": _arm(0.5, 4.5, 2.0)}},
                      {"context": 256, "arms": {"native": _arm(2, 8, 2.25), "sink4+win8": _arm(0.75, 9, 1.5)}}]}
    fig, (ax_attn, ax_step, ax_acc), title = drawn(m, tmp_path)
    assert _lines(ax_attn)["native"] == ([64, 256], [2.0, 4.0])
    assert _lines(ax_step) == {"native: draft": ([64, 256], [1.0, 2.0]), "native: verify": ([64, 256], [4.0, 8.0]),
                               "sink4+win8: draft": ([64, 256], [0.5, 0.75]),
                               "sink4+win8: verify": ([64, 256], [4.5, 9.0])}
    styles = _styles(ax_step)
    assert [styles[f"native: {x}"][0] for x in ("draft", "verify")] == ["-", "--"]
    assert styles["native: draft"][1] == styles["native: verify"][1] != styles["sink4+win8: draft"][1]
    assert _lines(ax_acc) == {"native": ([64, 256], [2.5, 2.25]), "sink4+win8": ([64, 256], [2.0, 1.5])}
    assert ax_acc.get_title() == "Mean accept length, depth 3" and ax_step.get_xscale() == "log"
    assert title == "wmtp reproduce on wikitext-2, preset tiny (cpu, torch 9.9, decode float64)"  # tiny: a smoke test


def test_decode_is_a_panel_per_loop(drawn, tmp_path):
    """Each loop's rows by context (given out of order), dense ms per token in black."""
    def row(loop, context, dense_ms, draft_ms, verify_ms):
        return {"loop": loop, "context": context, "dense": {"tpot_s": dense_ms / 1e3},
                "arms": {"sink4+win8": _arm(draft_ms, verify_ms, 2.0)}}

    m = {"kind": "bench-decode", "environment": ENV, "decode_dtype": "float32", "config": {"spec": {"depth": 4}},
         "rows": [row("eager", 1024, 3, 1, 5), row("eager", 128, 2, 0.5, 4), row("graph", 128, 1, 0.25, 2)]}
    fig, (eager, graph), title = drawn(m, tmp_path)
    assert _lines(eager) == {"dense: ms per token": ([128, 1024], [2.0, 3.0]),
                             "sink4+win8: draft": ([128, 1024], [0.5, 1.0]),
                             "sink4+win8: verify": ([128, 1024], [4.0, 5.0])}
    assert _lines(graph)["sink4+win8: verify"] == ([128], [2.0])
    assert _styles(eager)["dense: ms per token"] == ("-", "black")
    assert (eager.get_title(), graph.get_title(), graph.get_yscale()) == ("eager loop", "graph loop", "log")
    assert title == "wmtp bench decode (Test CPU, torch 9.9, decode float32, depth 4)"


def _methods(**us):
    """Methods' µs per token a row, and with the prefills 10 more (``name_x`` is method ``name x``)."""
    return {name.replace("_", " "): {"us_per_token_per_row": v, "us_per_token_per_row_with_prefill": v + 10}
            for name, v in us.items()}


def test_batch_is_each_methods_time_against_the_batch_size(drawn, tmp_path):
    """A row of panels per context and measure, a column per (lengths, loop); a method keeps its colour
    in every panel, lockstep dashed, refill dotted, the dense batch black; a method timed only at the
    larger batch is drawn; a (context, lengths, loop) never run is an empty panel, off."""
    def row(context, lengths, batch, **us):
        return {"context": context, "lengths": lengths, "loop": "graph", "batch": batch, "methods": _methods(**us)}

    rows = [row(64, "equal", 4, dense_batch=40, lockstep_w=30, refill_w=20),
            row(64, "equal", 1, dense_batch=50, lockstep_w=35),  # batches out of order
            row(64, "mixed", 1, dense_batch=55, refill_w=25),  # no lockstep here: refill keeps its colour
            row(256, "equal", 1, dense_batch=60, lockstep_w=45)]  # no (256, mixed) cell
    m = {"kind": "bench-batch", "environment": ENV, "decode_dtype": "float32", "config": {"spec": {"depth": 4}},
         "rows": rows}
    fig, axes, title = drawn(m, tmp_path)
    grid = fig.axes  # 4 rows of panels (64, 256) x (decode, with prefills), 2 columns (equal, mixed)
    assert len(grid) == 8 and [ax.axison for ax in grid] == [True] * 5 + [False, True, False]
    assert axes == [ax for ax in grid if ax.axison]
    steps, prefills, mixed = grid[0], grid[2], grid[3]  # 64 tokens: equal, equal with prefills, mixed with
    assert _lines(steps) == {"dense batch": ([1, 4], [50, 40]), "lockstep w": ([1, 4], [35, 30]),
                             "refill w": ([4], [20])}
    assert _lines(prefills)["lockstep w"] == ([1, 4], [45, 40]) and _lines(mixed) == {
        "dense batch": ([1], [65]), "refill w": ([1], [35])}
    styles = _styles(steps)
    assert styles == {"dense batch": ("-", "black"), "lockstep w": ("--", "C0"), "refill w": (":", "C1")}
    assert _styles(mixed)["refill w"] == (":", "C1")
    assert [t.get_text() for t in steps.get_xticklabels()] == ["1", "4"] and list(steps.get_xticks()) == [1, 4]
    assert steps.get_title() == "64 tokens, equal lengths, graph loop: decode steps"
    assert prefills.get_title() == "64 tokens, equal lengths, graph loop: with the prefills"
    assert (steps.get_xscale(), steps.get_yscale()) == ("log", "log")
    assert title == "wmtp bench batch (Test CPU, torch 9.9, decode float32, depth 4; every run lossless)"
    for r in rows[1:]:  # a run without prefill times: one row of panels a context
        for x in r["methods"].values():
            del x["us_per_token_per_row_with_prefill"]
    fig, axes, _ = drawn(m, tmp_path)
    assert len(fig.axes) == 4 and fig.axes[1].get_title() == "64 tokens, mixed lengths, graph loop: decode steps"


def test_depth_is_bars_per_arm_and_policy_with_dense_dashed(drawn, tmp_path):
    """Bars of width 0.8 / policies, centred on each arm; a gated arm's label on two lines."""
    def arm(*ms):
        return {"policies": {p: {"tpot_s": t / 1e3} for p, t in zip(("fixed-3", "adaptive"), ms)}}

    m = {"kind": "bench-depth", "environment": ENV, "decode_dtype": "float32", "policies": ["fixed-3", "adaptive"],
         "rows": [{"context": 128, "loop": "eager", "dense": {"tpot_s": 0.005},
                   "arms": {"native": arm(4, 3), "sink4+win8+gate64": arm(2, 1)}}]}
    fig, (ax,), title = drawn(m, tmp_path)
    assert _bars(ax) == {"fixed-3": [(-0.2, 4.0, None), (0.8, 2.0, None)],
                         "adaptive": [(0.2, 3.0, None), (1.2, 1.0, None)]}
    assert {round(p.get_width(), 9) for p in ax.patches} == {0.4}
    assert _lines(ax) == {"dense": ([0, 1], [5.0, 5.0])} and _styles(ax)["dense"] == ("--", "black")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["native", "sink4+win8\n+gate64"]
    assert ax.get_title() == "128 tokens, eager loop"
    assert title == "wmtp bench depth (Test CPU, torch 9.9, decode float32; every run lossless)"


def _al(mean, *per_seed):
    return {"mean_accept_length": mean, "mean_accept_length_per_seed": list(per_seed)}


@pytest.mark.parametrize("kind,key,bench", [("bench-sampling", "methods", "sampling"),
                                            ("bench-positions", "positions", "positions")])
def test_acceptance_is_bars_per_arm_and_variant_with_the_seeds_range(drawn, tmp_path, kind, key, bench):
    """A panel per (temperature, context): temperatures down, contexts across; each arm's AL per variant
    as bars from 0, the whiskers from the lowest seed's AL to the highest."""
    def row(temperature, context, a):
        return {"temperature": temperature, "context": context,
                "arms": {"native": {key: {"v1": _al(a, a - 0.5, a + 0.25), "v2": _al(a + 1, a + 1, a + 1)}},
                         "sink4+win8": {key: {"v1": _al(a / 2, a / 2 - 0.25, a / 2 + 0.5),
                                              "v2": _al(a, a - 1, a + 1)}}}}

    m = {"kind": kind, "environment": ENV, "decode_dtype": "float32",
         "rows": [row(0.0, 64, 2.0), row(0.0, 256, 3.0), row(1.0, 256, 4.0)]}  # no (1.0, 64) panel
    fig, axes, title = drawn(m, tmp_path)
    assert axes == [fig.axes[0], fig.axes[1], fig.axes[3]]  # the grid's (0, 0), (0, 1), (1, 1)
    assert _bars(axes[2]) == {"v1": [(-0.2, 4.0, (3.5, 4.25)), (0.8, 2.0, (1.75, 2.5))],
                              "v2": [(0.2, 5.0, (5.0, 5.0)), (1.2, 4.0, (3.0, 5.0))]}
    assert [ax.get_title() for ax in axes] == ["64 tokens, temperature 0", "256 tokens, temperature 0",
                                               "256 tokens, temperature 1"]
    assert axes[2].get_ylim()[0] == 0
    assert title == f"wmtp bench {bench} (Test CPU, torch 9.9, decode float32; whiskers: the seeds' range)"


def test_finish_writes_a_png_of_every_panel_with_its_legend_and_grid(monkeypatch, tmp_path):
    """``_finish``: a legend and a grid on each panel given, the title, the PNG at 110 dpi (6 x 4.2
    inches: 660 x 462 pixels), written where asked and nothing else."""
    got, finish = [], plots._finish
    monkeypatch.setattr(plots, "_finish", lambda fig, axes, *a: got.append((fig, axes)) or finish(fig, axes, *a))
    (tmp_path / "m.json").write_text(json.dumps({"kind": "draft-attention", "environment": ENV, "dtype": "float32",
                                                 "rows": DRAFT_ROWS}))
    data = plots.render(tmp_path / "m.json", tmp_path / "out.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "out.png"]
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (660, 462)
    (fig, (ax,)), = got
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["native", "sink4+win8"]
    assert ax.xaxis.get_gridlines()[0].get_visible() and ax.yaxis.get_gridlines()[0].get_visible()
    assert fig.get_suptitle() == "wmtp bench attention (cpu, torch 9.9, float32)"


def test_render_tells_the_kinds_apart(monkeypatch, tmp_path):
    """A reproduction has both ``contexts`` and ``draft_attention``; the GPU sweep of ``wmtp bench
    attention`` has ``rows`` and ``methods`` and no kind, and ``contexts`` too (it is no reproduction);
    ``contexts`` alone is no metrics file."""
    from wmtp import bench_report

    drawn = []
    monkeypatch.setattr(bench_report, "plot", lambda m, png: drawn.append("sweep"))
    monkeypatch.setattr(plots, "plot_reproduction", lambda m, png: drawn.append("reproduction"))
    path = tmp_path / "m.json"
    for m in ({"rows": [{}], "methods": ["sdpa"], "contexts": [64]}, {"contexts": [{}], "draft_attention": []}):
        path.write_text(json.dumps(m))
        plots.render(path)
    assert drawn == ["sweep", "reproduction"]
    path.write_text(json.dumps({"contexts": [{}]}))
    with pytest.raises(ValueError, match="is not a metrics file of 'wmtp reproduce' or 'wmtp bench'"):
        plots.render(path)
