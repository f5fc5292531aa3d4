"""gpuengine/bench/profile/families.py: real kernel names, as CUPTI reports them on the GPU machines, land in their
op family; every kernel the engine compiles has a family; the table's rules and labels agree."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuengine.bench.profile import families
from gpuengine.bench.profile.families import FAMILIES, OTHER, RULES, family_of, label, ordered

PACKAGE = Path(families.__file__).resolve().parents[2]

# Names from cuDNN 9, cuBLAS 12, CUTLASS, ATen, Inductor and the engine: a few per family, as profilers print them.
REAL_NAMES = {
    "conv_fprop": [
        "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_"
        "execute_segment_k_off_kernel__5x_cudnn",
        "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x32x32_stage4_warpsize4x1x1_g1_"
        "tensor16x8x16_execute_kernel__5x_cudnn",
        "void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>(int, int, int, "
        "float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, "
        "float const*, float const*, bool, int, int)",
        "cudnn_ampere_scudnn_128x64_relu_small_nn_v1",
        "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, float, int>"
        "(at::GenericPackedTensorAccessor<float, 4ul, at::DefaultPtrTraits, int>)",
        "depthwise_forward",
    ],
    "conv_dgrad": [
        "sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_"
        "execute_segment_k_off_kernel__5x_cudnn",
        "void cutlass_cudnn::Kernel<cutlass_tensorop_f16_s16816dgrad_optimized_f16_128x256_32x3_unity_stride>"
        "(cutlass_tensorop_f16_s16816dgrad_optimized_f16_128x256_32x3_unity_stride::Params)",
        "void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>(int, int, int, float const*, int, "
        "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, "
        "int, int, int)",
        "void at::native::(anonymous namespace)::conv_depthwise2d_backward_kernel<3, 1, float, int>"
        "(at::GenericPackedTensorAccessor<float const, 4ul, at::DefaultPtrTraits, int>)",
        "depthwise_dgrad",
    ],
    "conv_wgrad": [
        "sm90_xmma_wgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_"
        "execute_kernel__5x_cudnn",
        "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 8, 3, 3, 5, false, 512>(int, int, int, float const*, int, "
        "float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)",
        "void at::native::(anonymous namespace)::conv_depthwise2d_grad_weight_kernel<float, int>"
        "(at::GenericPackedTensorAccessor<float const, 4ul, at::DefaultPtrTraits, int>)",
        "direct_wgrad_partials",
        "depthwise_wgrad_sum",
        "cudnn_generated_fort_native_sm90_convBwdFilter_knob_2_128x128x64_5_0",
    ],
    "norm": [
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*, "
        "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, "
        "float)",
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, "
        "cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, "
        "float*, float*, float const*, float const*, float)",
        "void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::InvStd, float, float, 4>"
        "(float const*, int, int, float*, float*, volatile int*, int*, double)",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, "
        "float const*, float const*, float*, float*, float*)",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float, float>(long, long, "
        "float const*, float const*, float const*, float const*, float*, float*)",
        "triton_red_fused__native_batch_norm_legit_functional_0",
        "triton_per_fused_native_layer_norm_native_layer_norm_backward_3",
        "layernorm_fwd",
        "bn_inference",
    ],
    "gemm": [
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel"
        "__5x_cublas",
        "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
        "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
        "ampere_sgemm_128x64_tn",
        "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
        "(cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*, "
        "float const*, float*, void*, long, float*, int*)",
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
        "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float "
        "const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<int, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float>, float>, float, float)",
        "triton_tem_fused_mm_0",
    ],
    "attention": [
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0",
        "void cudnn::fusion::matmul_dq<true, 64>(void const*, void const*, void*, unsigned int, unsigned int, "
        "unsigned int)",
        "void cudnn::fusion::compute_dot_do_o<true>(void const*, void const*, void*, void*, unsigned int)",
        "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int)",
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, "
        "true, 64, 64, 64, true, true>::Params)",
        "fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80,"
        " float, true, false, true, 64, 64, 64, false>::Params)",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, false, false, "
        "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
    ],
    "elementwise": [
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar("
        "at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::"
        "operator()() const::{lambda()#14}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
        "std::array<char*, 2ul>)",
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
        "<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, "
        "at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, "
        "at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1})",
        "triton_poi_fused_convolution_relu_0",
        "triton_poi_fused__to_copy_1",
        "generatedNativePointwise",
        "bn_tail",
        "forward",
        "dropout_mask",
        "cupy_multiply__float32_float32_float32",
    ],
    "reduction": [
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4, 4>)",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        "triton_red_fused_sum_0",
        "triton_per_fused__log_softmax_0",
        "void cudnn::maxpool_nhwc<float, 2, false>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*)",
        "softmax_xent",
        "column_partials",
        "column_sum",
        "maxpool_forward",
        "adaptive_average_backward",
    ],
    "optimizer": [
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)0, false>, double*, double, double, double, double, double, bool, bool, float const*, "
        "float const*>(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, "
        "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)0, false>, "
        "double*, double, double, double, double, double, bool, bool, float const*, float const*)",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<1>, at::native::(anonymous namespace)::UnaryOpScalarFunctor<float, 1, 1, 0>, "
        "std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
        "at::native::(anonymous namespace)::UnaryOpScalarFunctor<float, 1, 1, 0>, std::plus<float>, float)",
        "adam",
    ],
    "data": [
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>"
        "(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, "
        "at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)",
        "Memcpy DtoD (Device -> Device)",
        "Memset (Device)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda()#3}::operator()() const::{lambda()#8}::operator()() const::{lambda(float)#1}, "
        "std::array<char*, 2ul> >(int, std::array<char*, 2ul>)",
        "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(long const*, "
        "float const*, float*, int, long, int, int)",
        "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, long, unsigned long, long>::"
        "Policy800, false, long, long, unsigned long, int, int, cub::detail::identity_decomposer_t>(int*, int*, "
        "unsigned long*, unsigned long const*, long*, long const*, long*, long const*, int, int, int, "
        "cub::detail::identity_decomposer_t)",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
        "(cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float const*, float*)",
        "gather",
        "embed",
        "cupy_copy__float32_float32",
    ],
    "other": [
        "finish_step",
        "void cask__5x_cudnn::computeOffsetsKernel<false, false>(cask__5x_cudnn::ComputeOffsetsParams)",
    ],
}
# Engine kernels with no op family: the step counter's increment and the power study's injected delay.
ENGINE_OTHER = {"finish_step", "spin"}


@pytest.mark.parametrize("family,name", [(f, n) for f, names in REAL_NAMES.items() for n in names],
                         ids=lambda value: value[:60] if isinstance(value, str) else None)
def test_a_real_kernel_name_lands_in_its_family(family, name):
    assert family_of(name) == family


def test_every_family_has_real_names_in_the_test():
    assert set(REAL_NAMES) == {f for f, _ in FAMILIES}


def test_every_rule_names_a_family_of_the_table():
    assert {f for f, _ in RULES} <= {f for f, _ in FAMILIES} - {OTHER}


def test_every_kernel_the_engine_compiles_has_a_family():
    compiled = {m.group(1) for path in PACKAGE.rglob("*.py")
                for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", path.read_text())}
    assert len(compiled) > 30, "the scan found too few kernels: did the sources move?"
    unknown = sorted(name for name in compiled - ENGINE_OTHER if family_of(name) == OTHER)
    assert unknown == [], "add a rule to gpuengine/bench/profile/families.py for these kernels"


def test_labels_and_table_order():
    assert label("conv_dgrad") == "conv dgrad" and label("gemm") == "GEMM" and label("newer") == "newer"
    assert ordered({"data", "gemm", "zzz", "conv_fprop"}) == ["conv_fprop", "gemm", "data", "zzz"]
