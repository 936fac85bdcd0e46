"""Pictures of a run: the per-layer x expert activation heat map and the per-ubatch timeline.

Needs matplotlib (``pip install matplotlib``); nothing else in moeinfer does. From Python::

    ctx.set_timeline(4096)
    ctx.decode(tokens)
    moeinfer.plot.render(moeinfer.plot.context_data(ctx), "run.png")

From the command line, on the JSON that ``moeinfer-bench --plot FILE.png`` writes next to its picture::

    python3 -m moeinfer.plot FILE.json FILE.png [--width 1600] [--height 1000]

The data is a dict (the JSON's top-level object):

* ``expert_counts``: [n_layer][n_expert] tokens that selected each expert (Context.expert_counts()).
* ``resident_layers`` (optional): per layer, whether its experts live in device memory. Placement keeps
  a layer's experts all on the device or all in host RAM, so the mark is per layer.
* ``timeline`` (optional): Context.timeline()'s columns as lists (t_start, t_end, seconds_host_compute,
  seconds_device_submit, seconds_wait, bytes_weights, n_tokens).
* ``title`` (optional): a line above the pictures.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

# The timeline's parts of a ubatch, in the order drawn, and their colours (matplotlib's tab10).
PARTS = (
    ("seconds_host_compute", "host compute", "tab:blue"),
    ("seconds_device_submit", "device submit", "tab:orange"),
    ("seconds_wait", "wait (device uploads, kernels)", "tab:red"),
)
OTHER_COLOR = "tab:gray"
BAR_Y = 1.1  # the parts' bars span [1.1, 1.9] of the timeline's (0, 2): above the upload bars
RESIDENT_COLOR = "tab:red"
HEATMAP_CMAP = "viridis"  # perceptually ordered: a hotter expert is a brighter cell


def _figure_class():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("moeinfer.plot needs matplotlib (pip install matplotlib)") from e
    return Figure, FigureCanvasAgg


def context_data(ctx, title: str | None = None) -> dict:
    """The plot data of a moeinfer.Context: its expert counts, resident layers and timeline."""
    counts = ctx.expert_counts()
    resident = []
    for il in range(counts.shape[0]):
        try:
            where, _ = ctx.tensor_location(f"blk.{il}.ffn_up_exps.weight")
        except KeyError:  # a dense layer
            where = "host"
        resident.append(where == "device")
    tl = ctx.timeline()
    data = {"expert_counts": counts.tolist(), "resident_layers": resident,
            "timeline": {k: np.asarray(v).tolist() for k, v in tl.items() if k != "dropped"}}
    if title is not None:
        data["title"] = title
    return data


def heatmap(ax, counts, resident_layers=None) -> None:
    """Draws log(1 + counts) per layer (rows) x expert (columns) on `ax`; resident layers get a frame."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2:
        raise ValueError(f"expert_counts must be [n_layer][n_expert], got shape {counts.shape}")
    n_layer, n_expert = counts.shape
    image = ax.imshow(np.log1p(counts), aspect="auto", interpolation="nearest", cmap=HEATMAP_CMAP,
                      origin="upper", extent=(-0.5, n_expert - 0.5, n_layer - 0.5, -0.5))
    ax.figure.colorbar(image, ax=ax, label="log(1 + tokens)")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("expert activations (tokens per layer x expert)")
    if resident_layers is not None:
        resident = list(resident_layers)
        if len(resident) != n_layer:
            raise ValueError(f"resident_layers has {len(resident)} entries for {n_layer} layers")
        from matplotlib.patches import Rectangle
        for il, on_device in enumerate(resident):
            if on_device:
                ax.add_patch(Rectangle((-0.5, il - 0.5), n_expert, 1, fill=False, edgecolor=RESIDENT_COLOR,
                                       linewidth=1.5))
        if any(resident):
            ax.text(1.0, 1.01, "framed: experts resident on the device", transform=ax.transAxes, ha="right",
                    va="bottom", color=RESIDENT_COLOR, fontsize="small")


def timeline(ax, tl: dict) -> None:
    """Draws one bar per ubatch over [t_start, t_end], cut into its parts (PARTS; the rest is the
    scheduler's own work), with the weight bytes uploaded per ubatch on a second axis."""
    t0 = np.asarray(tl["t_start"], dtype=np.float64)
    t1 = np.asarray(tl["t_end"], dtype=np.float64)
    if t0.shape != t1.shape:
        raise ValueError("timeline: t_start and t_end differ in length")
    if t0.size == 0:
        ax.text(0.5, 0.5, "no ubatch recorded", transform=ax.transAxes, ha="center", va="center")
        ax.set_axis_off()
        return
    origin = t0.min()
    start, end = (t0 - origin) * 1e3, (t1 - origin) * 1e3
    left = start
    for key, label, color in PARTS:
        # The parts are sums over the ubatch, drawn one after the other (their order within it is not
        # recorded); clipped to the ubatch's span against clock jitter.
        width = np.minimum(np.asarray(tl[key], dtype=np.float64) * 1e3, np.maximum(end - left, 0))
        ax.barh(BAR_Y, width, left=left, height=0.8, color=color, label=label, align="edge")
        left = left + width
    rest = np.maximum(end - left, 0)
    ax.barh(BAR_Y, rest, left=left, height=0.8, color=OTHER_COLOR, label="scheduler", align="edge")
    ax.set_ylim(0, 2)
    ax.set_yticks([])
    ax.set_xlabel(f"ms since the record started: {t0.size} ubatches, as the host sees them")
    mb = np.asarray(tl.get("bytes_weights", np.zeros_like(t0)), dtype=np.float64) / 1e6
    up = ax.twinx()
    up.bar(start, mb, width=np.maximum(end - start, 1e-6), bottom=0, align="edge", alpha=0.35,
           color="black", label="weights uploaded (MB)")
    up.set_ylim(0, (mb.max() if mb.max() > 0 else 1.0) * 2.1)  # the upload bars in the lower half, under the parts
    up.set_ylabel("MB uploaded")
    handles, labels = ax.get_legend_handles_labels()
    h2, l2 = up.get_legend_handles_labels()
    # Above the axes, in the title's place: inside, it would hide the bars.
    ax.legend(handles + h2, labels + l2, loc="lower left", bbox_to_anchor=(0, 1), fontsize="x-small", ncol=3,
              frameon=False, borderaxespad=0.2)


def render(data: dict, path, width: int = 1600, height: int = 1000, dpi: int = 100):
    """Writes the pictures of `data` (see the module's docstring) as a width x height PNG; returns the Figure."""
    if width < 200 or height < 200:
        raise ValueError(f"the picture must be at least 200 x 200 pixels, got {width} x {height}")
    if "expert_counts" not in data:
        raise ValueError("plot data has no 'expert_counts'")
    Figure, FigureCanvasAgg = _figure_class()
    tl = data.get("timeline")
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    if tl:
        ax_heat, ax_time = fig.subplots(2, 1, height_ratios=(3, 1))
    else:
        ax_heat, ax_time = fig.subplots(1, 1), None
    heatmap(ax_heat, data["expert_counts"], data.get("resident_layers"))
    if ax_time is not None:
        timeline(ax_time, tl)
    if data.get("title"):
        fig.suptitle(data["title"])
    fig.savefig(path, dpi=dpi, format="png")  # no bbox "tight": the size stays width x height
    return fig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m moeinfer.plot",
                                     description="Renders a moeinfer-bench --plot JSON file as a PNG.")
    parser.add_argument("data", help="the JSON file (moeinfer-bench --plot writes it next to the PNG)")
    parser.add_argument("png", help="the picture to write")
    parser.add_argument("--width", type=int, default=1600, help="pixels (default 1600)")
    parser.add_argument("--height", type=int, default=1000, help="pixels (default 1000)")
    args = parser.parse_args(argv)
    try:
        with open(args.data, encoding="utf-8") as f:
            data = json.load(f)
        render(data, args.png, args.width, args.height)
    except ImportError as e:
        print(f"moeinfer.plot: {e}", file=sys.stderr)
        return 3
    except (OSError, ValueError, KeyError) as e:
        print(f"moeinfer.plot: {args.data}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
