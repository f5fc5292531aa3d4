"""One conv -> BN site of the fusion probe (probe_conv_bn_fusion.py) at one precision, on shared inputs.

`SiteRun` builds the engine's own Conv2D and BatchNorm2D layers for the site (today's F0 forward and B0
backward) and the fused pieces of conv_bn_fusion_gpu.py (F1, B1), trying each fused piece's variants in order
so an unsupported graph becomes a note, and checks every piece once against float64 NumPy.
"""
from __future__ import annotations

import time

import numpy as np

from conv_bn_sites import bn_finalize_ref, dbn_coefficients_ref, prologue_ref

_T0 = time.perf_counter()


def log(message: str):
    print(f"[{time.perf_counter() - _T0:6.1f}s] {message}", flush=True)


def rel_err(gpu, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(gpu, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


class SiteRun:
    """One site at one precision: the engine's layers (F0, B0) and the fused pieces (F1, B1) on shared inputs."""

    def __init__(self, site, precision: str, backend, seed: int):
        from gpuengine.layers import BatchNorm2D, Conv2D
        from gpuengine.layers.base import BuildContext
        from gpuengine.ops.cudnn import runtime_for
        from gpuengine.runtime.memory import Allocator
        from gpuengine.runtime.params import FlatParameters
        from gpuengine.runtime.precision import policy_for
        from gpuengine.workloads.resnet import BN_EPSILON, BN_MOMENTUM
        self.site, self.precision, self.backend = site, precision, backend
        self.xp, self.rng = backend.xp, np.random.default_rng(seed)
        self.runtime = runtime_for(backend)
        self.notes, self.graphs = [], {}
        self.eps, self.momentum = BN_EPSILON, BN_MOMENTUM
        policy = policy_for(precision)
        self.io = policy.compute_dtype
        self.count = site.batch * site.output_hwc[0] * site.output_hwc[1]
        conv = Conv2D(site.filters, site.kernel, stride=site.stride, padding=(site.pads[0], site.pads[2]),
                      use_bias=False, name="conv")
        residual = site.role == "block_end"
        bn = BatchNorm2D("relu" if site.relu else None, residual, BN_MOMENTUM, BN_EPSILON, name="bn")
        out_shapes = (site.output_hwc,) * (2 if residual else 1)
        allocator = Allocator(backend)
        params = FlatParameters(conv.param_specs(site.input_hwc) + bn.param_specs(*out_shapes), allocator, policy,
                                seed=seed, buffer_specs=bn.buffer_specs(*out_shapes))
        ctx = BuildContext(backend, policy, allocator, params, site.batch)
        self.ctx, self.conv, self.bn = ctx, conv, bn
        with backend.activate():
            self.x = self.random((site.batch,) + site.input_hwc)
            y = conv.build_forward(ctx, self.x)
            self.residual = self.random(y.shape) if residual else None
            bn.build_forward(ctx, y, *(() if self.residual is None else (self.residual,)))
            self.dout = self.random(y.shape)
            grads = bn.build_backward(ctx, self.dout, (True, True) if residual else True)
            conv.build_backward(ctx, grads[0] if residual else grads, site.input_grad)
        self.w = params.compute_view("conv.weight")
        self.sequences = {"F0": [conv.forward, bn.forward],
                          "B0": [bn.backward, bn.backward_params, conv.backward, conv.backward_params]}

    def random(self, shape, scale: float = 1.0, offset: float = 0.0, dtype=None):
        """A device buffer of normal values rounded to its dtype (never time zeros)."""
        host = (offset + scale * self.rng.standard_normal(shape)).astype(dtype or self.io)
        return self.backend.to_device(host)

    def host(self, a) -> np.ndarray:
        return self.backend.to_host(a).astype(np.float64)

    def attempt(self, what: str, variants):
        """The first variant (label, build) that cuDNN accepts; the others' errors become notes."""
        for label, build in variants:
            try:
                result = build()
                self.notes.append(f"{what}: {label}")
                return label, result
            except Exception as exc:   # cuDNN raises several types for an unsupported graph; all are reported
                # cuDNN's own reason, not CudnnUnsupported's wrapper: the graph key in front filled the cut
                message = " ".join(str(exc.__cause__ or exc).split())[:300]
                self.notes.append(f"{what}: {label} UNSUPPORTED ({type(exc).__name__}: {message})")
                log(f"  {what}: {label} unsupported: {type(exc).__name__}: {message}")
        return None, None

    # -- the fused pieces ------------------------------------------------------------------------------------

    def build_fused(self):
        """F1 and B1 as lists of launches; None where no variant of a piece was accepted."""
        from conv_bn_fusion_gpu import Kernels, partial_layout
        site, xp, f32 = self.site, self.xp, np.float32
        k = site.filters
        out_shape = (site.batch,) + site.output_hwc
        zeros = lambda shape, dtype=None: xp.zeros(shape, dtype or self.io)   # noqa: E731 (local shorthand)
        window = self.conv.window
        with self.backend.activate():
            self.y, self.stats = zeros(out_shape), zeros((2, 1, k), f32)
            self.gamma, self.beta = self.random((k,), 0.2, 1.0, f32), self.random((k,), 0.2, 0.0, f32)
            self.running_mean, self.running_var = self.random((k,), 0.1, 0.0, f32), self.random((k,), 0.1, 1.0, f32)
            self.mean, self.inv_std = zeros((k,), f32), zeros((k,), f32)
            fprop_variants = []
            if site.prologue:
                for dtype in dict.fromkeys([np.dtype(f32), np.dtype(self.io)]):   # float32 first, then the I/O type
                    fprop_variants.append((f"prologue+conv+genstats (s, b {dtype.name})",
                                           lambda d=dtype: self._fprop_prologue(d)))
                fprop_variants.append(("bn_apply kernel, then conv+genstats (no prologue)",
                                       lambda: self._fprop_materialized(f32)))
            else:
                fprop_variants.append(("conv+genstats", lambda: self._plain_fprop(f32)))
            label, fprop = self.attempt("F1 fprop", fprop_variants)
            if fprop is None:
                return None, None
            kern = self.kernels = Kernels(self.io, self.scale_dtype)
            self.scale, self.bias = zeros((k,), self.scale_dtype), zeros((k,), self.scale_dtype)
            finalize = lambda: kern.bn_finalize(self.stats, self.gamma, self.beta, self.running_mean,  # noqa: E731
                                                self.running_var, self.scale, self.bias, self.mean, self.inv_std,
                                                self.count, self.eps, self.momentum)
            forward = fprop + [finalize]
            self.out = None
            if site.role in ("materialized", "block_end"):
                self.out = zeros(out_shape)
                extra = {}
                if site.dual:   # the projection's raw output and its BN's scale and bias
                    extra = dict(residual=self.random(out_shape), scale2=self.random((k,), 0.2, 1.0, self.scale_dtype),
                                 bias2=self.random((k,), 0.2, 0.0, self.scale_dtype))
                elif site.role == "block_end":
                    extra = dict(residual=self.residual)
                self.apply_extra = extra
                forward.append(lambda: kern.bn_apply(self.y, self.scale, self.bias, self.out, site.relu, **extra))
            return forward, self._build_fused_backward(window, out_shape, partial_layout)

    def _prev_bn(self, dtype):
        """The previous site's BN scale and bias (a prologue's), in `dtype`."""
        c = self.site.input_hwc[2]
        self.scale_dtype = np.dtype(dtype)
        self.prev_scale = self.random((c,), 0.2, 1.0, dtype)
        self.prev_bias = self.random((c,), 0.2, 0.0, dtype)

    def _fprop_prologue(self, dtype):
        from conv_bn_fusion_gpu import fprop_genstats
        self._prev_bn(dtype)
        self.fprop_graph = fprop_genstats(self.runtime, self.precision, self.conv.window, self.x, self.w, self.y,
                                          self.stats[0, 0], self.stats[1, 0], self.prev_scale, self.prev_bias)
        return [self._graph("fprop", self.fprop_graph)]

    def _fprop_materialized(self, dtype):
        """relu(s*x + b) written by a kernel, then a plain conv+genstats graph."""
        from conv_bn_fusion_gpu import Kernels, fprop_genstats
        self._prev_bn(dtype)
        self.x_applied = self.xp.zeros_like(self.x)
        kern = Kernels(self.io, dtype)
        self.fprop_graph = fprop_genstats(self.runtime, self.precision, self.conv.window, self.x_applied, self.w,
                                          self.y, self.stats[0, 0], self.stats[1, 0])
        return [lambda: kern.bn_apply(self.x, self.prev_scale, self.prev_bias, self.x_applied, True),
                self._graph("fprop", self.fprop_graph)]

    def _plain_fprop(self, dtype):
        from conv_bn_fusion_gpu import fprop_genstats
        self.scale_dtype = np.dtype(dtype)
        self.fprop_graph = fprop_genstats(self.runtime, self.precision, self.conv.window, self.x, self.w, self.y,
                                          self.stats[0, 0], self.stats[1, 0])
        return [self._graph("fprop", self.fprop_graph)]

    def _build_fused_backward(self, window, out_shape, partial_layout):
        from gpuengine.ops.cudnn import conv_data_grad, conv_weight_grad
        from conv_bn_fusion_gpu import dgrad_drelu, wgrad_prologue
        site, xp, kern, f32 = self.site, self.xp, self.kernels, np.float32
        k, c = site.filters, site.input_hwc[2]
        rt, p = self.runtime, self.precision
        self.da = self.dout   # the gradient at this BN's output (for a prologue BN: dz from the next conv's dgrad)
        relu_here = site.role in ("materialized", "block_end")
        self.dz = xp.zeros(out_shape, self.io) if site.role == "block_end" else None
        if site.role == "conv_prologue":   # the next convolution's fused dgrad summed dz and dz*y already
            self.bpart = self.random((2, 1, k), 1.0, 0.0, f32)
        else:
            self.bpart = xp.zeros((2,) + partial_layout(out_shape)[3:4] + (k,), f32)
        self.coef, self.dgamma, self.dbeta = xp.zeros((3, k), f32), xp.zeros((k,), f32), xp.zeros((k,), f32)
        self.dy = xp.zeros(out_shape, self.io)
        backward = []
        if site.role != "conv_prologue":
            backward.append(lambda: kern.dbn_partials(self.da, self.y, self.scale, self.bias, self.bpart, relu_here,
                                                      self.dz))
        backward.append(lambda: kern.dbn_finalize(self.bpart, self.mean, self.inv_std, self.gamma, self.dgamma,
                                                  self.dbeta, self.coef, self.count))
        grad = self.dz if self.dz is not None else self.da
        backward.append(lambda: kern.dbn_apply(grad, self.y, self.scale, self.bias, self.coef, self.dy,
                                               relu_here and self.dz is None))
        in_shape = (site.batch,) + site.input_hwc
        self.dx = xp.zeros(in_shape, self.io) if site.input_grad else None
        if site.input_grad and site.prologue:
            prev = dict(scale=self.prev_scale, bias=self.prev_bias)
            self.prev_part = xp.zeros((2,) + partial_layout(in_shape)[3:4] + (c,), f32)
            self.prev_sums = xp.zeros((2, 1, c), f32)
            variants = [
                ("dgrad+drelu+2 reductions", lambda: [self._graph("dgrad", dgrad_drelu(
                    rt, p, window, self.dy, self.w, self.x, dz=self.dx, dsum=self.prev_sums[0, 0],
                    dxsum=self.prev_sums[1, 0], **prev))]),
                ("dgrad+drelu, sums by dbn_partials kernel", lambda: [
                    self._graph("dgrad", dgrad_drelu(rt, p, window, self.dy, self.w, self.x, dz=self.dx, **prev)),
                    lambda: kern.dbn_partials(self.dx, self.x, self.prev_scale, self.prev_bias, self.prev_part, False)]),
                ("plain dgrad, drelu+sums by dbn_partials kernel", lambda: self._plain_dgrad_then_sums(window))]
            self.dgrad_label, pieces = self.attempt("B1 dgrad", variants)
            if pieces is None:
                return None
            backward += pieces
        elif site.input_grad:
            backward.append(conv_data_grad(rt, p, window, self.dy, self.w, self.dx).run)
        self.dw = xp.zeros(self.w.shape, self.io)
        if site.prologue:
            variants = [("wgrad with prologue", lambda: [self._graph("wgrad", wgrad_prologue(
                rt, p, window, self.x, self.prev_scale, self.prev_bias, self.dy, self.dw))]),
                        ("bn_apply kernel, then plain wgrad", lambda: self._materialized_wgrad(window))]
            _, pieces = self.attempt("B1 wgrad", variants)
            if pieces is None:
                return None
            backward += pieces
        else:
            backward.append(conv_weight_grad(rt, p, window, self.x, self.dy, self.dw).run)
        master = self.ctx.params.grad_view("conv.weight")
        if master.dtype != self.dw.dtype:   # bf16: widen into the float32 gradient, as the engine's Conv2D does
            backward.append(lambda: xp.copyto(master, self.dw))
        return backward

    def _graph(self, name: str, bound):
        """Keep a fused graph for the plan report; its launch."""
        self.graphs[name] = bound
        return bound.run

    def _plain_dgrad_then_sums(self, window):
        from gpuengine.ops.cudnn import conv_data_grad
        self.dx_raw = self.xp.zeros_like(self.dx)
        graph = conv_data_grad(self.runtime, self.precision, window, self.dy, self.w, self.dx_raw)
        kern = self.kernels
        return [graph.run, lambda: kern.dbn_partials(self.dx_raw, self.x, self.prev_scale, self.prev_bias,
                                                     self.prev_part, True, self.dx)]

    def _materialized_wgrad(self, window):
        from gpuengine.ops.cudnn import conv_weight_grad
        self.x_applied_w = self.xp.zeros_like(self.x)
        graph = conv_weight_grad(self.runtime, self.precision, window, self.x_applied_w, self.dy, self.dw)
        kern = self.kernels
        return [lambda: kern.bn_apply(self.x, self.prev_scale, self.prev_bias, self.x_applied_w, True), graph.run]

    # -- numerics: every fused piece against float64 NumPy on its own inputs ---------------------------------

    def check(self, run_forward, run_backward) -> dict:
        """Run F1 then B1 once and compare each piece's outputs with float64 (the engine's NumPy Conv2D)."""
        from correctness_tests.layer_harness import run_layer
        from gpuengine.layers import Conv2D
        site, h = self.site, self.host
        before = {"running_mean": h(self.running_mean), "running_var": h(self.running_var)}
        with self.backend.activate():
            run_forward()
            run_backward()
            self.backend.synchronize()
        x = h(self.x)
        image = prologue_ref(x, h(self.prev_scale), h(self.prev_bias)) if site.prologue else x
        conv = Conv2D(site.filters, site.kernel, stride=site.stride, padding=(site.pads[0], site.pads[2]),
                      use_bias=False, name="conv")
        ref = run_layer(conv, image, h(self.dy), precision="fp64", weights={"conv.weight": h(self.w)})
        err, y, stats = {}, h(self.y), h(self.stats)[:, 0]
        err["fprop y"] = rel_err(y, ref["y"])
        err["genstats"] = rel_err(stats, [ref["y"].sum(axis=(0, 1, 2)), (ref["y"] ** 2).sum(axis=(0, 1, 2))])
        fin = bn_finalize_ref(stats[0], stats[1], self.count, h(self.gamma), h(self.beta), before["running_mean"],
                              before["running_var"], self.eps, self.momentum)
        got = {"scale": self.scale, "bias": self.bias, "mean": self.mean, "inv_std": self.inv_std,
               "running_mean": self.running_mean, "running_var": self.running_var}
        err["bn_finalize"] = max(rel_err(h(a), fin[name]) for name, a in got.items())
        s, b = h(self.scale), h(self.bias)
        if self.out is not None:
            v = y * s + b
            extra = self.apply_extra
            if "scale2" in extra:
                v = v + h(extra["residual"]) * h(extra["scale2"]) + h(extra["bias2"])
            elif "residual" in extra:
                v = v + h(extra["residual"])
            err["bn_apply"] = rel_err(h(self.out), np.maximum(v, 0.0) if site.relu else v)
        da = h(self.da)
        relu_here = site.role in ("materialized", "block_end")
        dz = da * (y * s + b > 0) if relu_here else da
        if site.role == "conv_prologue":
            sums = h(self.bpart).sum(axis=1)
        else:
            sums = np.stack([dz.sum(axis=(0, 1, 2)), (dz * y).sum(axis=(0, 1, 2))])
            err["dbn_partials"] = rel_err(h(self.bpart).sum(axis=1), sums)
            if self.dz is not None:
                err["dbn_partials dz"] = rel_err(h(self.dz), dz)
        coef = dbn_coefficients_ref(sums[0], sums[1], self.count, h(self.mean), h(self.inv_std), h(self.gamma))
        err["dbn_finalize"] = max(rel_err(h(self.coef), [coef["A"], coef["B"], coef["C"]]),
                                  rel_err(h(self.dgamma), coef["dgamma"]), rel_err(h(self.dbeta), coef["dbeta"]))
        err["dbn_apply"] = rel_err(h(self.dy), coef["A"] * dz + coef["B"] * y + coef["C"])
        if self.dx is not None and site.prologue:
            mask = x * h(self.prev_scale) + h(self.prev_bias) > 0
            dzp = ref["dx"] * mask
            err["dgrad+drelu"] = rel_err(h(self.dx), dzp)
            buffer = self.prev_sums if self.dgrad_label.startswith("dgrad+drelu+2") else self.prev_part
            err["prev BN sums"] = rel_err(h(buffer).sum(axis=1), [dzp.sum(axis=(0, 1, 2)),
                                                                  (dzp * x).sum(axis=(0, 1, 2))])
        elif self.dx is not None:
            err["dgrad"] = rel_err(h(self.dx), ref["dx"])
        err["wgrad"] = rel_err(h(self.dw), ref["grad:conv.weight"])
        return err
