"""cuDNN convolution scratch on the GPU: for each convolution, the bytes allocated
inside the op beyond its outputs (peak during the op - allocated after it), forward and backward
(data and weight gradients together, then each alone), at the first call of a shape (cuDNN's
heuristics: torch allocates the largest workspace of the candidate plans) and at the second
(the chosen plan's). Writes $OUT/conv_ws.json."""

from __future__ import annotations

import json
import os

import torch

out_dir = os.environ.get("OUT", "/tmp/conv_ws")
os.makedirs(out_dir, exist_ok=True)
dev = torch.device("cuda")
torch.backends.cudnn.benchmark = os.environ.get("BENCH", "0") == "1"
aten = torch.ops.aten


def scratch(fn, *args):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    res = fn(*args)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    return torch.cuda.max_memory_allocated() - after, after - base, res


# (N, Cin, H(=W), Cout, k, stride, pad, groups); 2-D unless H is a tuple (1-D: (L,))
CONFIGS = [
    (16, 3, 224, 32, 7, 2, 3, 1),
    (16, 3, 224, 64, 7, 2, 3, 1),
    (16, 3, 224, 384, 16, 16, 0, 1),
    (16, 3, 224, 768, 16, 16, 0, 1),
    (16, 32, 56, 64, 3, 1, 1, 1),
    (16, 64, 56, 64, 3, 1, 1, 1),
    (16, 64, 56, 128, 3, 2, 1, 1),
    (16, 64, 56, 128, 1, 2, 0, 1),
    (16, 128, 28, 128, 3, 1, 1, 1),
    (16, 128, 28, 256, 3, 2, 1, 1),
    (16, 128, 28, 256, 1, 2, 0, 1),
    (16, 256, 14, 256, 3, 1, 1, 1),
    (16, 256, 14, 512, 3, 2, 1, 1),
    (16, 256, 14, 512, 1, 2, 0, 1),
    (16, 512, 7, 512, 3, 1, 1, 1),
    (32, 64, 56, 64, 3, 1, 1, 1),
    (32, 256, 14, 256, 3, 1, 1, 1),
    (8, 256, 56, 64, 1, 1, 0, 1),
    (8, 64, 56, 256, 1, 1, 0, 1),
    (8, 1024, 14, 256, 1, 1, 0, 1),
    (8, 96, 56, 96, 7, 1, 3, 96),
    (8, 384, 14, 384, 3, 1, 1, 384),
    (4, 3, 512, 64, 3, 1, 1, 1),
    (4, 64, 128, 64, 3, 1, 1, 1),
    (16, 1, (16000,), 512, 10, 5, 0, 1),
    (16, 512, (3199,), 512, 3, 2, 0, 1),
    (16, 768, (499,), 768, 128, 1, 64, 16),
    (2, 1, (3200,), 8, 5, 1, 0, 1),
]
rows = []
for dtype, fmt in (
    (torch.float32, "contiguous"),
    (torch.bfloat16, "contiguous"),
    (torch.bfloat16, "channels_last"),
):
    for n, cin, h, cout, k, s, p, g in CONFIGS:
        one_d = isinstance(h, tuple)
        if fmt == "channels_last" and one_d:
            continue
        shape = (n, cin, *h) if one_d else (n, cin, h, h)
        wshape = (cout, cin // g, k) if one_d else (cout, cin // g, k, k)
        x = torch.randn(shape, device=dev, dtype=dtype)
        w = torch.randn(wshape, device=dev, dtype=dtype)
        if fmt == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
            w = w.contiguous(memory_format=torch.channels_last)
        stride, pad = ([s], [p]) if one_d else ([s, s], [p, p])
        dil = [1] * len(stride)
        row = {
            "dtype": str(dtype)[6:],
            "format": fmt,
            "x": list(shape),
            "w": list(wshape),
            "stride": s,
            "pad": p,
            "groups": g,
            "x_bytes": x.numel() * x.element_size(),
            "w_bytes": w.numel() * w.element_size(),
        }
        try:
            for call in ("first", "second"):
                fs, fo, y = scratch(
                    aten.convolution, x, w, None, stride, pad, dil, False, [0] * len(stride), g
                )
                row[f"fwd_{call}"] = fs
                row["y_bytes"] = y.numel() * y.element_size()
                gy = torch.randn_like(y)
                for mask in ((True, True, False), (True, False, False), (False, True, False)):
                    key = {
                        (True, True, False): "bwd",
                        (True, False, False): "dgrad",
                        (False, True, False): "wgrad",
                    }[mask]
                    bs, bo, _ = scratch(
                        aten.convolution_backward,
                        gy,
                        x,
                        w,
                        None,
                        stride,
                        pad,
                        dil,
                        False,
                        [0] * len(stride),
                        g,
                        list(mask),
                    )
                    row[f"{key}_{call}"] = bs
                del y, gy
        except Exception as e:
            row["error"] = repr(e)[:200]
        rows.append(row)
        torch.cuda.empty_cache()
res = {
    "torch": torch.__version__,
    "cudnn": torch.backends.cudnn.version(),
    "benchmark": torch.backends.cudnn.benchmark,
    "device": torch.cuda.get_device_name(),
    "rows": rows,
}
with open(os.path.join(out_dir, f"conv_ws_bench{int(torch.backends.cudnn.benchmark)}.json"), "w") as fh:
    json.dump(res, fh, indent=0)
for r in rows:
    print(
        r["dtype"],
        r["format"],
        r["x"],
        r["w"],
        r["stride"],
        {k: v for k, v in r.items() if k.endswith(("first", "second"))},
        r.get("error", ""),
    )
