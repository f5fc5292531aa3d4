"""Every CUDA kernel the engine compiles, with every define combination it compiles it with.

Kernels without compiled-in geometry are listed here with the compute dtypes
of the precision policies. Kernels with compiled-in geometry take their defines
from the layers' own builders (`kernel_defines`, `direct_wgrad_defines`) over
every node of the real workload networks: the seed shapes, both ResNet and CNN
fusions, the zoo at 224x224 and reduced. So the table follows the workloads as
they change, and a define builder that breaks a kernel fails here too.
test_kernels_compile.py compiles each row with NVRTC and checks that every
`get_kernel` call site has rows.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from gpuengine import optim
from gpuengine.bench import injected_delay
from gpuengine.config import PRECISIONS
from gpuengine.data import gather
from gpuengine.layers import (AdaptiveAveragePool2D, BatchNorm2D, Conv2D, MaxPool2D, TokenEmbedding, activations,
    adaptive_pool, batchnorm, dropout, embedding, layernorm, merge, pooling, positional)
from gpuengine.losses import cross_entropy, fused_head, mse as losses, token_cross_entropy
from gpuengine.model.network import INPUT
from gpuengine.ops import (batchnorm as ops_batchnorm, conv_pool, cudnn_attention, depthwise, direct_wgrad,
                           partial_sums, reductions, transpose, widen)
from gpuengine.runtime import step_state
from gpuengine.runtime.kernels import ctype, define_items
from gpuengine.runtime.precision import policy_for
from gpuengine.workloads import cnn, resnet, zoo
from gpuengine.workloads.registry import WORKLOADS


@dataclass(frozen=True)
class KernelCase:
    """One get_kernel(source, kernel, **defines) the engine makes; `where` says which use it comes from."""

    module: str          # the module of the call site, e.g. "gpuengine.layers.pooling"
    source_expr: str     # the call's source argument as written there, e.g. "_SOURCE" or "SOURCES[kind]"
    kernel: str
    defines: tuple       # kernels.define_items of the call's defines
    variant: str         # which of a call site's sources (SOURCES[kind]: the kind), "" where it has one
    where: str = field(compare=False)
    source: str = field(compare=False, repr=False)

    @property
    def site(self) -> tuple[str, str, str]:
        return self.module, self.source_expr, self.kernel

    @property
    def id(self) -> str:
        described = ",".join(f"{k}={v}" for k, v in self.defines)
        variant = f"{self.variant}:" if self.variant else ""
        return f"{self.module.removeprefix('gpuengine.')}:{variant}{self.kernel}[{described}]"


def _case(module, kernel: str, where: str, source_expr: str = "_SOURCE", source: str | None = None,
          variant: str = "", **defines) -> KernelCase:
    text = getattr(module, source_expr) if source is None else source
    return KernelCase(module.__name__, source_expr, kernel, define_items(defines), variant, where, text)


def compute_dtypes() -> dict[str, np.dtype]:
    """The activation dtype of each precision toggle, once per distinct dtype (tf32 stores fp32)."""
    found = {}
    for precision in PRECISIONS:
        found.setdefault(np.dtype(policy_for(precision).compute_dtype), precision)
    return {precision: dtype for dtype, precision in found.items()}


# Kernels whose only define is ELEM_T, the compute dtype: (module, kernel names).
_ELEMENT_KERNELS = [
    (positional, ("add_table",)),
    (fused_head, ("head_rows", "head_columns", "head_rows_t", "head_columns_t", "head_reduce")),
    (dropout, ("dropout_mask", "dropout_advance")),
    (cross_entropy, ("softmax_xent", "softmax_xent_wide")),
    (losses, ("mse",)),
    (token_cross_entropy, ("count_tokens", "token_xent")),
    (transpose, ("transpose",)),
]


def _shape_free_cases():
    for precision, dtype in compute_dtypes().items():
        elem, where = ctype(dtype), f"{precision} compute dtype"
        for module, kernels in _ELEMENT_KERNELS:
            for kernel in kernels:
                yield _case(module, kernel, where, ELEM_T=elem)
        for width in (w for w in (1, 2, 4, 8) if w * dtype.itemsize <= 16):   # up to 16 bytes a thread
            for kind, text in activations.SOURCES.items():
                for kernel in ("forward", "backward"):
                    yield _case(activations, kernel, f"{kind}, {where}, {width} a thread", "SOURCES[kind]", text,
                                kind, ELEM_T=elem, VEC=width)
            yield _case(merge, "add2", f"{where}, {width} a thread", ELEM_T=elem, VEC=width)
            if width <= 4:   # LayerNorm's lanes take up to 4 features
                for kernel in ("layernorm_fwd", "layernorm_add_fwd"):
                    for packs in (0, 16 // width):   # the row read again, or held in registers (16 features a lane)
                        yield _case(layernorm, kernel, f"{where}, {width} a lane, {packs} packs held",
                                    "FORWARD_SOURCE", ELEM_T=elem, VEC=width, PACKS=packs)
                yield _case(layernorm, "layernorm_bwd", f"{where}, {width} a lane", "SOURCE", ELEM_T=elem, VEC=width)
                # its sums finished by the program (DEFER 1) or by the last block, by turns
                yield _case(layernorm, "layernorm_param_grads", f"{where}, {width} a lane, defer {width % 2}",
                            "SOURCE", ELEM_T=elem, VEC=width, DEFER=width % 2)
                # a lane's packs of its row; dy's parts; a Linear's bias gradient summed beside (BIAS_SUM)
                # and the block's partials finished by the program (DEFER) or by the last block
                for packs, parts, bias, defer in ((1, 1, 0, 1), (16 // width, 2, 0, 0), (1, 2, 1, 0),
                                                  (16 // width, 1, 1, 1)):
                    yield _case(layernorm, "layernorm_bwd_grads", f"{where}, {width} a lane, {packs} packs, "
                                f"dy in {parts}, bias sum {bias}, defer {defer}", "FUSED_SOURCE", ELEM_T=elem,
                                VEC=width, PACKS=packs, DY_PARTS=parts, BIAS_SUM=bias, DEFER=defer)
        # ColumnSum reads the compute dtype and sums in float, in one launch; fused with an activation's gradient too;
        # finished by a training program's PartialSums (DEFER 1) or by the last block, by turns.
        defer = int(elem == "float")
        yield _case(reductions, "column_sum", f"{where}, defer {defer}", ELEM_T=elem, DEFER=defer)
        for kind, text in activations.SUM_SOURCES.items():
            defer = 1 - defer
            yield _case(activations, "backward_column_sum", f"{kind}, {where}, defer {defer}", "SUM_SOURCES[kind]",
                        text, kind, ELEM_T=elem, DEFER=defer)
        for width in (w for w in (1, 2, 4, 8) if w * dtype.itemsize <= 16):   # whole rows, up to 16 bytes a thread
            defer = int(width in (2, 8))   # finished by the program or by the last block, by turns
            yield _case(reductions, "row_sum", f"{where}, {width} a thread, defer {defer}", "_ROW_SOURCE",
                        ELEM_T=elem, VEC=width, DEFER=defer)
            for kind, text in activations.ROW_SUM_SOURCES.items():
                defer = 1 - defer
                yield _case(activations, "backward_row_sums", f"{kind}, {where}, {width} a thread, defer {defer}",
                            "ROW_SUM_SOURCES[kind]", text, kind, ELEM_T=elem, VEC=width, DEFER=defer)
        policy = policy_for(precision)
        copy = policy.compute_dtype if policy.needs_compute_copy else np.float32   # as Adam chooses its copy
        for vector in (1, 0):   # 16-byte aligned buffers, and the scalar loop alone
            yield _case(optim, "adam", f"{precision} master/compute, vector {vector}", COPY_T=ctype(copy),
                        HAS_COPY=int(policy.needs_compute_copy), VECTOR=vector)
        yield _case(optim, "adam_rows", f"{precision} master/compute, bf16 gradients read in place",
                    COPY_T=ctype(copy), HAS_COPY=int(policy.needs_compute_copy), VECTOR=1)
    # Attention casts fp32 activations to the bf16 fused engines and back.
    for src, dst in (("float", "bf16_t"), ("bf16_t", "float")):
        for width in (1, 2, 4):
            yield _case(cudnn_attention, "cast", f"attention cast, {width} a thread", "_CAST_SOURCE", SRC_T=src,
                        DST_T=dst, VEC=width)
    for width in (1, 2, 4):   # bf16 weight gradients into their float masters, by the alignment of the buffers
        yield _case(widen, "widen_chunks", f"gradient widening, {width} a thread", VEC=width)
    yield _case(partial_sums, "partial_sums", "column sums finished by the program", RUN_WARPS=partial_sums.RUN_WARPS)
    # The engine's batch norm a channel a lane (VEC 1: channels not a multiple of 8, or an unaligned buffer), its
    # clusters (CLUSTER: chosen at build from the batch, so the networks' nodes list it at 1 only) and its early
    # launch (EARLY: LAUNCH_EARLY on sm_90, so the networks' nodes built without a GPU list it at 0), with the mask,
    # y or neither read backward.
    rows = (("bf16_t", 1, 1, 1, 24, 1, 1, 0), ("float", 2, 0, 0, 12, 1, 2, 1), ("bf16_t", 1, 1, 1, 128, 8, 8, 1),
            ("float", 0, 0, 0, 64, 8, 4, 1))
    for elem, act, mask, residual, channels, vec, cluster, early in rows:
        for kernel, source, cache, parts in (("bn_forward", "FORWARD_SOURCE", 8, 1),   # most and fewest trips kept
                                             ("bn_backward", "BACKWARD_SOURCE", 1, 2)):
            yield _case(ops_batchnorm, kernel, f"batch norm, {channels} channels {vec} a lane, {cache} trips kept, "
                        f"dy in {parts}, cluster {cluster}, early {early}", source, ELEM_T=elem,
                        HAS_RESIDUAL=residual, ACT=act, MASK=mask, CHANNELS=channels, VEC=vec, CACHE=cache,
                        DY_PARTS=parts, CLUSTER=cluster, EARLY=early)
    for kernel in ("finish_step", "book_loss"):
        yield _case(step_state, kernel, "step counter")
    yield _case(injected_delay, "spin", "injected delay")
    yield from _gather_cases()


def _gather_cases():
    """Both word types: rows of 16-byte and of 4-byte multiples."""
    for features in (4, 3):
        rows = np.zeros((2, features), np.float32)
        _, word_type, _ = gather.as_words(rows)
        yield _case(gather, "gather", f"rows of {4 * features} bytes", WORD_T=word_type)
    yield _case(gather, "gather_t", "float32 rows, also batch-innermost", WORD_T="float")


def workload_networks():
    """(name, Network) of every workload of the table at its seed shape, the variants the suite also trains (the
    CNN's unfused ReLU, ResNet's unfused block ends), and every zoo network full size and reduced."""
    for name, entry in WORKLOADS.items():
        yield name, entry.build(entry.seed_shape)
    yield "cnn fused_relu=False", cnn.build_cnn(fused_relu=False)
    yield "resnet50 cifar fused=False", resnet.build_resnet(fused=False)
    for name, net in zoo.ZOO.items():
        yield f"{name} 224", net.network(reduced=False)
        yield f"{name} reduced", net.network(reduced=True)


def _node_cases(net, node, dtype, where):
    layer, shapes = node.layer, net.input_shapes(node)
    found = []
    if isinstance(layer, MaxPool2D):
        found.append((pooling, "_SOURCE", ("maxpool_forward", "maxpool_backward"),
                      layer.kernel_defines(shapes[0], dtype)))
    elif isinstance(layer, AdaptiveAveragePool2D):   # GlobalAveragePool2D too: the pool to 1x1
        found.append((adaptive_pool, "_SOURCE", ("adaptive_average_forward", "adaptive_average_backward"),
                      layer.kernel_defines(shapes[0], dtype)))
    elif isinstance(layer, BatchNorm2D):
        found.append((batchnorm, "_SOURCE", ("bn_inference", "bn_tail"), layer.kernel_defines(shapes[0], dtype)))
        vec = ops_batchnorm.pack_width(shapes[0][2])   # batchnorm=engine: each direction keeps its own trips
        for kernel, source, cache_bytes in (("bn_forward", "FORWARD_SOURCE", ops_batchnorm.FORWARD_CACHE_BYTES),
                                            ("bn_backward", "BACKWARD_SOURCE", ops_batchnorm.BACKWARD_CACHE_BYTES)):
            found.append((ops_batchnorm, source, (kernel,), {
                **layer.kernel_defines(shapes[0], dtype), "VEC": vec, "DY_PARTS": 1, "CLUSTER": 1, "EARLY": 0,
                "CACHE": ops_batchnorm.cache_trips(vec, np.dtype(dtype).itemsize, cache_bytes)}))
    elif isinstance(layer, Conv2D) and layer.depthwise_defines(shapes[0], dtype) is not None:
        found.append((depthwise, "_SOURCE", ("depthwise_forward", "depthwise_dgrad", "depthwise_wgrad_partials",
                                            "depthwise_wgrad_sum"), layer.depthwise_defines(shapes[0], dtype)))
    elif isinstance(layer, Conv2D) and node.inputs == (INPUT,):   # only a first layer needs no input gradient
        found.append((direct_wgrad, "_SOURCE", ("direct_wgrad_partials", "direct_wgrad_sum"),
                      layer.direct_wgrad_defines(shapes[0], dtype)))
        readers = net.readers(node.name)   # a max pool alone above it: the kernels read its gradient (passes.py)
        if len(readers) == 1 and isinstance(readers[0].layer, MaxPool2D):
            pool = readers[0].layer.window_of(net.shapes[node.name])
            if direct_wgrad.pool_fits(pool):
                pooled = layer.direct_wgrad_defines(shapes[0], dtype, pool)
                found.append((direct_wgrad, "_SOURCE", ("direct_wgrad_partials", "direct_wgrad_sum"), pooled))
                found.append((conv_pool, "_SOURCE", ("conv_pool_forward",), pooled))
    elif isinstance(layer, TokenEmbedding):   # ids travel in the compute dtype; the positional table added or not
        found.append((embedding, "_SOURCE", ("embed", "embed_grad"), layer.kernel_defines(dtype, dtype)))
        found.append((embedding, "_SOURCE", ("embed",), {**layer.kernel_defines(dtype, dtype), "POSITIONS": 1}))
    for module, source_expr, kernels, defines in found:
        if defines is not None:   # None: this node runs no kernel (a view, or another engine)
            for kernel in kernels:
                yield _case(module, kernel, f"{where} node {node.name}", source_expr, **defines)


def _geometry_cases():
    for name, net in workload_networks():
        for precision, dtype in compute_dtypes().items():
            for node in net.nodes:
                yield from _node_cases(net, node, dtype, f"{name} {precision}")


@functools.lru_cache(maxsize=None)
def kernel_cases() -> tuple[KernelCase, ...]:
    """Every distinct (call site, defines), the first use found naming it."""
    unique = {}
    for case in [*_shape_free_cases(), *_geometry_cases()]:
        unique.setdefault(case, case)
    return tuple(unique.values())
