"""Kernel names to op families: one small table of name patterns, first match wins.

The profile sums each family's kernel time per training step, so the engine
and the references compare op by op whatever their kernels are called:
cuDNN's (`sm90_xmma_fprop_implicit_gemm_...`, `cudnn::bn_fw_tr_1C11_...`,
`cudnn_generated_fort_native_sdpa_...`), cuBLAS's and CUTLASS's
(`nvjet_tst_...`, `sm90_xmma_gemm_...`, `cutlass_80_tensorop_...`), ATen's
(`at::native::vectorized_elementwise_kernel<...>`, `reduce_kernel<...>`,
`multi_tensor_apply_kernel<... FusedAdamMathFunctor ...>`), Inductor's Triton
kernels (`triton_poi_` pointwise, `triton_red_` and `triton_per_` reductions,
`triton_tem_` GEMM templates) and the engine's own (`gather`, `adam`,
`softmax_xent`, `layernorm_fwd`, ...: see gpuengine/ops, layers, losses).

The order is the rules': attention before the convolutions (cuDNN's SDPA
kernels say `flash_fprop`), normalization before Inductor's prefixes (a
`triton_poi_fused_native_batch_norm_...` is batch norm's work), Inductor's
prefixes before the convolutions (its `triton_poi_fused_convolution_relu`
is the bias and ReLU around cuDNN's conv, not the conv), the convolutions'
directions before GEMM (cuDNN's convolutions are implicit GEMMs), GEMM before
data and reduction (cuBLAS's `splitKreduce_kernel`). A name no rule knows is
`other`; the profile lists those names so the table can learn them.
"""
from __future__ import annotations

import re

# (family, what the report calls it), in the order tables show them.
FAMILIES = (
    ("conv_fprop", "conv fprop"),
    ("conv_dgrad", "conv dgrad"),
    ("conv_wgrad", "conv wgrad"),
    ("norm", "batch/layer norm"),
    ("gemm", "GEMM"),
    ("attention", "attention"),
    ("elementwise", "elementwise"),
    ("reduction", "reduction (loss, pooling)"),
    ("optimizer", "optimizer (Adam)"),
    ("data", "data (gather/copy)"),
    ("other", "other"),
)
OTHER = "other"
LABELS = dict(FAMILIES)

# (family, pattern searched in the demangled kernel name, case ignored): the first that matches names the family.
RULES = (
    # cuDNN's SDPA backward runs dO.O and dQ's matmul and cast as kernels of their own (cudnn::fusion::)
    ("attention", r"sdpa|flash|fmha|attention|attn|compute_dot_do_o|matmul_dq|convert_dq_to"),
    ("norm", r"batch_?norm|bn_(fw|bw|inference)|^bn_(forward|backward)$|layer_?norm"
             r"|group_?norm|rms_?norm|gammabetabackward|rowwisemoments"),
    ("gemm", r"^triton_tem_"),
    ("reduction", r"^triton_(red|per)_"),
    ("elementwise", r"^triton_poi_"),
    ("conv_wgrad", r"wgrad|conv_depthwise2d_grad_weight|bwd_?filter"),
    ("conv_dgrad", r"dgrad|conv_depthwise2d_backward|bwd_?data"),
    ("conv_fprop", r"fprop|convolve|conv2d_grouped_direct|conv_depthwise2d_forward|depthwise_forward|scudnn"
                   r"|winograd|convolution|conv_fwd|fwd_conv"),
    ("optimizer", r"adam|multi_tensor_apply|fused_?optimizer|foreach"),
    ("gemm", r"gemm|gemv|nvjet|splitkreduce|cutlass|cublas|matmul|bmm|xmma|wgmma"),
    ("data", r"gather|index_?select|index_elementwise|indexing_backward|scatter|embed|compute_grad_weight|memcpy"
             r"|memset|direct_copy|cupy_copy|catarraybatchedcopy|randperm|radix|sort|nchwtonhwc|nhwctonchw"
             r"|permutation|^transpose$"),
    ("reduction", r"reduce|reduction|softmax|xent|nll_loss|cross_entropy|^mse$|column_(partials|sum)|row_sums?"
                  r"|^head_(rows|columns)(_t)?$|^head_reduce$|^partial_sums$|book_loss|count_tokens|pool"
                  r"|adaptive_average|^cupy_(sum|max|min|mean|prod|argmax|argmin)"),
    ("elementwise", r"elementwise|pointwise|^(forward|backward)$|^add2$|^bn_tail$|^add_table$|dropout|^cast$"
                    r"|^cupy_|fill|relu|gelu|tanh|sigmoid|^widen_chunks$"),
)
_COMPILED = tuple((family, re.compile(pattern, re.IGNORECASE)) for family, pattern in RULES)


def family_of(kernel_name: str) -> str:
    """The op family of one kernel (or memcpy/memset) name as the profiler reports it; `other` if no rule knows it."""
    for family, pattern in _COMPILED:
        if pattern.search(kernel_name):
            return family
    return OTHER


def label(family: str) -> str:
    """What tables call a family ('conv fprop', 'GEMM'); an unknown key as it is."""
    return LABELS.get(family, family)


def ordered(families) -> list[str]:
    """`families` in the table's order, ones this table does not know (a newer file's) last, by name."""
    known = [f for f, _ in FAMILIES if f in families]
    return known + sorted(f for f in families if f not in LABELS)
