// Kernel classification: real kernel names as profilers print them, and context-driven cases.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "profile/classify.h"
#include "profile/op_shapes.h"

namespace kforge {
namespace {

struct NamedKernel {
  std::string name;
  std::string op;
  std::string rule;
};

// Real names from PyTorch 2.x workloads on H100/A100 (nsys/ncu/torch.profiler output quoted in
// public issues, reports and test fixtures; the origin of each group is noted). Some are cut
// where the quoting tool cut them ("…"); classification must hold for the cut forms too.
const std::vector<NamedKernel> kRealNames = {
    // cuBLAS / cuBLASLt on Hopper: nvjet_* (kernel tables of H100 training and vLLM profiles).
    {"nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul", "gemm"},
    {"nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN", "matmul", "gemm"},
    {"nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "matmul", "gemm"},
    {"nvjet_tst_64x32_64x16_2x2_2cta_h_bz_splitK_TNT", "matmul", "gemm"},  // nsys cuda_gpu_kern_sum
    {"nvjet_tss_64x8_64x16_2x1_v_bz_splitK_TNT", "matmul", "gemm"},
    {"nvjet_hsh_256x128_64x4_2x1_v_bz_TNN", "matmul", "gemm"},
    {"nvjet_tst_256x96_64x5_2x1_2cta_v_badd_NNT", "matmul", "gemm"},
    {"nvjet_sm120_tst_mma_64x64x128_3_32x32x128_tmaAB_alignCD4_bz_TNNN", "matmul", "gemm"},
    // cuBLAS xmma / Ampere families (nsys stats of Hopper runs, ncu kernel lists).
    {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas",
     "matmul", "gemm"},
    {"sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8", "matmul", "gemm"},
    {"ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "matmul", "gemm"},
    {"ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_stages_64x5_tn", "matmul", "gemm"},
    {"ampere_sgemm_128x64_tn", "matmul", "gemm"},
    {"splitKreduce_kernel", "matmul", "gemm"},  // cuBLASLt split-K epilogue
    {"gemv2T_kernel_val", "matmul", "gemm"},
    // CUTLASS (ncu/nsys listings; CUTLASS 3 names from the profiler and Inductor's CUTLASS
    // backend).
    {"void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>("
     "T1::Params)",
     "matmul", "gemm"},
    {"void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>("
     "T1::Params)",
     "matmul", "gemm"},
    {"void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)", "matmul",
     "gemm"},
    {"cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_"
     "align8_warpspecialized_pingpong_epi_tma",
     "matmul", "gemm"},
    {"cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x128x64_2x1x1_0_tnt_align8_"
     "warpspecialized_cooperative_epi_tma",
     "matmul", "gemm"},
    // FlashAttention-2 inside PyTorch (ncu kernel list of a Llama run), split-KV, FA3 (vLLM trace
    // fixture).
    {"void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 64, 64, 4, "
     "0, 0, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 64, 4, "
     "cutlass::bfloat16_t>>, 0, 1, 0, 0, 1, 1, 0>(pytorch_flash::Flash_fwd_params) ",
     "flash_attention", "flash-attention-2"},
    {"void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_tra",  // cut by nsys
     "flash_attention", "flash-attention-2"},
    {"void pytorch_flash::flash_fwd_splitkv_kernel<traits>(params)", "flash_attention",
     "flash-attention-2"},
    {"void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
     "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, "
     "cute::tuple<cute::C<128>, cute::C<128>, cute::C<128>>, 128, cutlass::bfloat16_t, float, "
     "cutlass::arch::Sm90, true, false, false, true, false, false, true, true, false, true, "
     "false, false>>>>(flash::FlashAttnFwdSm90<...>::Params)",
     "flash_attention", "flash-attention-3"},
    // Memory-efficient attention and cuDNN SDPA (SDPA backend sweeps on A100/H100).
    {"fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
     "cutlass::Sm80, 1, 64, 64, 64, 1, 1>::Params)",
     "flash_attention", "mem-efficient-attention"},
    {"fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "flash_attention", "mem-efficient-attention"},
    {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x",
     "flash_attention", "cudnn-sdpa"},
    {"cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
     "flash_attention", "cudnn-sdpa"},
    // Backward kernels: no kforge op.
    {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x", "other",
     "backward"},
    {"fmha_cutlassB_bf16_aligned_128x128_k128_sm80", "other", "backward"},
    {"void (anonymous namespace)::softmax_warp_backward(...)", "other", "backward"},
    {"void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, "
     "long>(float*, float const*,",
     "other", "backward"},
    {"triton_per_fused_native_layer_norm_native_layer_norm_backward_9", "other", "backward"},
    {"triton_red_fused__log_softmax_backward_data_nll_loss_backward_nll_loss_forward_2", "other",
     "backward"},
    // ATen (torch.profiler key_averages and nsys tables).
    {"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, "
     "float, float const*, float const*, float const*, float*, float*, float*)",
     "layernorm", "aten-layernorm"},
    {"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>("
     "int, float, float const*, float const*, float const*, float*, float*, float*)",
     "layernorm", "aten-layernorm"},
    {"void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, "
     "c10::Half, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::Half*, "
     "c10::Half const*, int)",
     "softmax", "softmax-kernel"},
    {"void at::native::<unnamed>::cunn_SoftMaxForward<(int)8, c10::BFloat16, float,...", "softmax",
     "softmax-kernel"},
    {"void <unnamed>::softmax_warp_forward<float, float, float, (int)2, (bool)0, (bool)0>(T2 *, "
     "const T1 …",
     "softmax", "softmax-kernel"},
    {"void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, "
     "c10::Half, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::Half*, "
     "c10::Half const*, int)",
     "cross_entropy", "aten-log-softmax"},
    {"void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>("
     "float*, float const*, int, int, int, bool const*, int, bool)",
     "cross_entropy", "aten-log-softmax-warp"},
    {"void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, "
     "float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, "
     "long, long)",
     "cross_entropy", "cross-entropy-kernel"},
    {"void cunn_ClassNLLCriterion_updateOutput_kernel(Dtype *, Dtype *, Dtype *, long *, Dtype *, "
     "int, int, int, int, long) [with Dtype = float, Acctype = float]",
     "cross_entropy", "cross-entropy-kernel"},
    {"void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
     "at::native::MeanOps<float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, "
     "at::native::MeanOps<float, float>, unsigned int, float, 4>)",
     "reduce", "aten-sum"},
    {"void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, "
     "at::native::func_wrapper_t<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, "
     "c10::BFloat16>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, "
     "c10::BFloat16, 4, 8> >(at::native::ReduceOp<c10::BFloat16, "
     "at::native::func_wrapper_t<c10::BFloat16, at::native::sum_functor<c10::BFloat16",
     "reduce", "aten-sum"},
    {"void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
     "at::native::ArgMaxOps<float>, unsigned int, long, 4>>(at::native::ReduceOp<float, "
     "at::native::ArgMaxOps<float>, unsigned int, long, 4>)",
     "other", "aten-other-reduction"},
    {"void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctorOnSelf_add<"
     "int>,",
     "other", "elementwise"},
    {"void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
     "TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() const::[lambda() (instance ",
     "other", "elementwise"},
    // Triton kernels generated by torch.compile (Inductor output code, ncu filters, traces).
    {"triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "rmsnorm", "triton-rmsnorm"},
    {"triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_11", "rmsnorm", "triton-rmsnorm"},
    {"triton_per_fused_native_layer_norm_0", "layernorm", "triton-layernorm"},
    {"triton_per_fused_native_layer_norm_view_0", "layernorm", "triton-layernorm"},
    {"triton_per_fused__softmax_3", "softmax", "triton-softmax"},
    {"triton_per_fused__softmax__to_copy_add_div_6", "softmax", "triton-softmax"},
    {"triton_per_fused__softmax_add_logical_not_masked_fill_ones_tril_zeros_like_3", "softmax",
     "triton-softmax"},
    {"triton_red_fused__log_softmax__to_copy_12", "cross_entropy", "triton-cross-entropy"},
    {"triton_red_fused__log_softmax_9", "cross_entropy", "triton-cross-entropy"},
    {"triton_red_fused_nll_loss_forward_10", "cross_entropy", "triton-cross-entropy"},
    {"triton_poi_fused_mul_silu_2", "fused_mlp", "triton-swiglu"},
    {"triton_poi_fused_mul_silu_slice_1", "fused_mlp", "triton-swiglu"},
    {"triton_tem_fused_mm_0", "matmul", "triton-matmul-template"},
    {"triton_tem_fused__to_copy_addmm_gelu_t_9", "matmul", "triton-matmul-template"},
    {"triton_tem_fused_gelu_mm_mul_14", "matmul", "triton-matmul-template"},
    {"triton_red_fused_sum_3", "reduce", "triton-sum"},
    {"triton_red_fused_sum_view_1", "reduce", "triton-sum"},
    {"triton_poi_fused_gelu_view_7", "other", "triton-other"},
    // "scaled_mm" and "cutlass" inside a reduction's fused name are no GEMM.
    {"triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm_max_mul_reciprocal_unsqueeze_1",
     "other", "triton-other"},
    // Other libraries (vLLM, custom training kernels, NCCL), and convolutions.
    {"void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16*, "
     "c10::BFloat16 const*, float, int, int)",
     "rmsnorm", "rmsnorm-kernel"},
    {"_rope_kernel", "rotary_embedding", "rotary-kernel"},
    {"act_and_mul_kernel", "fused_mlp", "swiglu-kernel"},
    {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "other",
     "unmatched"},
    {"sm86_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize25", "other",
     "convolution"},
    {"void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop_optimize", "other",
     "convolution"},
    {"precomputed_convolve_sgemm", "other", "convolution"},
    {"void group_norm_silu_nhwc_kernel<__half>(__half const*, __half*, __half ", "other",
     "unmatched"},
};

TEST(ClassifyKernelName, RealNamesFromPyTorchProfiles) {
  ASSERT_GE(kRealNames.size(), 40u);
  KernelClassifier classifier;
  for (const auto& k : kRealNames) {
    const Classification c = classifier.classify(k.name, std::vector<ContextOp>{});
    EXPECT_EQ(c.op, k.op) << k.name << " (rule " << c.rule << ")";
    EXPECT_EQ(c.rule, k.rule) << k.name;
    EXPECT_EQ(c.evidence, Evidence::kernel_name);
    EXPECT_EQ(c.context_index, -1);
    EXPECT_FALSE(c.reason.empty());
  }
}

// Context entries as emit_nvtx and the example models write them.
std::vector<ContextOp> context(const std::vector<std::string>& texts) {
  std::vector<ContextOp> out;
  for (const auto& t : texts)
    out.push_back(parse_context({t, {}, {}}));
  return out;
}

const char* kElementwise =
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>,"
    " std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, "
    "3ul>)";
const char* kGemm = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT";
const char* kMean =
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
    "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, "
    "float>, unsigned int, float, 4>)";

TEST(ClassifyContext, InnermostOpDecidesWhateverTheKernel) {
  KernelClassifier classifier;
  // aten::linear -> aten::matmul -> aten::mm: the innermost op with a rule decides, even for a
  // copy kernel the matmul launches, and the chain of matmul ops around it is one call, decided
  // at its outermost op.
  const auto linear =
      context({"aten::linear, seq = 5, op_id = 20, sizes = [[8, 512], [512, 512], []]",
               "aten::matmul, op_id = 21, sizes = [[8, 512], [512, 512]]",
               "aten::mm, seq = 6, op_id = 22, sizes = [[8, 512], [512, 512]]"});
  Classification c = classifier.classify(kElementwise, linear);
  EXPECT_EQ(c.op, "matmul");
  EXPECT_EQ(c.rule, "aten-matmul");
  EXPECT_EQ(c.evidence, Evidence::context_op);
  EXPECT_EQ(c.context_index, 0);
  // A copy under aten::matmul and the GEMM under aten::bmm inside it: one call.
  const auto bmm =
      context({"aten::matmul, op_id = 40, sizes = [[8, 12, 256, 64], [8, 12, 64, 256]]",
               "aten::bmm, op_id = 44, sizes = [[96, 256, 64], [96, 64, 256]]"});
  EXPECT_EQ(classifier.classify(kGemm, bmm).context_index, 0);
  const auto copy =
      context({"aten::matmul, op_id = 40, sizes = [[8, 12, 256, 64], [8, 12, 64, 256]]",
               "aten::reshape, op_id = 41", "aten::clone, op_id = 42", "aten::copy_, op_id = 43"});
  EXPECT_EQ(classifier.classify(kElementwise, copy).context_index, 0);
  EXPECT_EQ(classifier.classify(kElementwise, copy).op, "matmul");

  // An op without a rule leaves the decision to the kernel name.
  c = classifier.classify(kElementwise, context({"module::Attention",
                                                 "aten::add, seq = 9, "
                                                 "op_id = 30"}));
  EXPECT_EQ(c.op, "other");
  EXPECT_EQ(c.rule, "elementwise");
  EXPECT_EQ(c.context_index, -1);

  // Backward: matmuls stay matmuls, the rest is other.
  c = classifier.classify(kGemm, context({"autograd::engine::evaluate_function: MmBackward0",
                                          "MmBackward0", "aten::mm, seq = 40, op_id = 90"}));
  EXPECT_EQ(c.op, "matmul");
  c = classifier.classify(
      "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<"
      "c10::Half, float>(c10::Half const*)",
      context({"NativeLayerNormBackward0", "aten::native_layer_norm_backward"}));
  EXPECT_EQ(c.op, "other");
  EXPECT_EQ(c.rule, "backward");
  EXPECT_EQ(c.context_index, 0);  // both entries are backward ops

  // A sum alone is a reduce.
  c = classifier.classify(kMean, context({"aten::mean, seq = 3, op_id = 7, sizes = [[64, 4096]]"}));
  EXPECT_EQ(c.op, "reduce");
}

TEST(ClassifyContext, EnclosingOpsOwnEveryKernelInside) {
  KernelClassifier classifier;
  // An eager RMSNorm module: the aten::mean inside it is part of the norm, not a reduce.
  const auto norm =
      context({"module::RMSNorm, sizes = [[2, 128, 512], [512]]",
               "aten::mean, seq = 3, op_id = 8, sizes = [[2, 128, 512], [], [], []]"});
  Classification c = classifier.classify(kMean, norm);
  EXPECT_EQ(c.op, "rmsnorm");
  EXPECT_EQ(c.rule, "module-rmsnorm");
  EXPECT_EQ(c.evidence, Evidence::module);
  EXPECT_EQ(c.context_index, 0);

  // The innermost enclosing entry decides (both say rmsnorm; the aten op carries the shapes).
  c = classifier.classify(kElementwise, context({"module::LlamaRMSNorm",
                                                 "aten::rms_norm, seq = 4, "
                                                 "op_id = 9"}));
  EXPECT_EQ(c.op, "rmsnorm");
  EXPECT_EQ(c.context_index, 1);
  EXPECT_EQ(c.evidence, Evidence::context_op);

  // SDPA's math path: its bmm and softmax are the attention.
  const auto math = context({"aten::scaled_dot_product_attention, seq = 1, op_id = 2",
                             "aten::_scaled_dot_product_attention_math, op_id = 3",
                             "aten::bmm, seq = 2, op_id = 4"});
  c = classifier.classify(kGemm, math);
  EXPECT_EQ(c.op, "flash_attention");
  EXPECT_EQ(c.context_index, 1);

  // Cross-entropy: log_softmax and nll_loss inside it are the loss; alone, log_softmax is no op.
  const std::string log_softmax =
      "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, "
      "c10::BFloat16, at::native::(anonymous "
      "namespace)::LogSoftMaxForwardEpilogue>(c10::BFloat16*, "
      "c10::BFloat16 const*, int)";
  c = classifier.classify(
      log_softmax, context({"aten::cross_entropy_loss, seq = 7, op_id = 50",
                            "aten::log_softmax, op_id = 51", "aten::_log_softmax, op_id = 52"}));
  EXPECT_EQ(c.op, "cross_entropy");
  EXPECT_EQ(c.rule, "aten-cross-entropy");
  c = classifier.classify(log_softmax,
                          context({"aten::log_softmax, op_id = 51", "aten::_log_softmax"}));
  EXPECT_EQ(c.op, "other");
  EXPECT_EQ(c.rule, "aten-log-softmax-alone");
  // Without any context, the name says cross-entropy.
  EXPECT_EQ(classifier.classify(log_softmax, std::vector<ContextOp>{}).op, "cross_entropy");

  // Rotary modules: the class name picks the convention.
  EXPECT_EQ(classifier.classify(kElementwise, context({"module::RotaryEmbedding"})).op,
            "rotary_embedding");
  EXPECT_EQ(classifier.classify(kElementwise, context({"module::RotaryEmbeddingHalf"})).op,
            "rotary_embedding_half");
  // Hugging Face's <Model>RotaryEmbedding computes the cos/sin tables; the rotation is elsewhere.
  const Classification tables =
      classifier.classify(kElementwise, context({"module::LlamaRotaryEmbedding"}));
  EXPECT_EQ(tables.op, "other");
  EXPECT_EQ(tables.group, "rope_tables");
  EXPECT_EQ(classifier.classify(kElementwise, context({"module::Qwen2RotaryEmbedding"})).group,
            "rope_tables");
  // torch.profiler's module entries.
  EXPECT_EQ(classifier.classify(kElementwise, context({"nn.Module: LlamaRMSNorm_0"})).op,
            "rmsnorm");
  EXPECT_EQ(classifier.classify(kElementwise, context({"nn.Module: T5LayerNorm_3"})).op,
            "layernorm");
}

TEST(ClassifyContext, MlpModuleOwnsItsMatmulsUnlessSplit) {
  const auto up =
      context({"module::SwiGLU, sizes = [[8, 512], [1408, 512], [1408, 512], [512, 1408]]",
               "aten::linear, seq = 11, op_id = 60, sizes = [[8, 512], [1408, 512], []]",
               "aten::matmul, op_id = 61", "aten::mm, seq = 12, op_id = 62"});
  const auto silu =
      context({"module::SwiGLU, sizes = [[8, 512], [1408, 512], [1408, 512], [512, "
               "1408]]",
               "aten::silu, seq = 13, op_id = 63"});
  const std::string silu_kernel =
      "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous "
      "namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}>(int)";
  KernelClassifier whole;
  EXPECT_EQ(whole.classify(kGemm, up).op, "fused_mlp");
  EXPECT_EQ(whole.classify(kGemm, up).context_index, 0);
  EXPECT_EQ(whole.classify(silu_kernel, silu).op, "fused_mlp");

  KernelClassifier split({.split_mlp = true});
  const Classification mm = split.classify(kGemm, up);
  EXPECT_EQ(mm.op, "matmul");
  EXPECT_EQ(mm.context_index, 3);
  const Classification rest = split.classify(silu_kernel, silu);
  EXPECT_EQ(rest.op, "other");
  EXPECT_EQ(rest.rule, "mlp-split");
}

TEST(ClassifyFacts, DtypeCausalAndShortNames) {
  EXPECT_EQ(
      dtype_from_kernel_name("void at::native::(anonymous "
                             "namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"),
      DType::bf16);
  EXPECT_EQ(dtype_from_kernel_name("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn"),
            DType::f16);
  EXPECT_EQ(dtype_from_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"),
            DType::bf16);
  EXPECT_EQ(dtype_from_kernel_name("void softmax_warp_forward<c10::Half, c10::Half, float, 7>"),
            DType::f16);
  EXPECT_EQ(dtype_from_kernel_name("ampere_sgemm_128x64_tn"), DType::f32);
  EXPECT_EQ(dtype_from_kernel_name("void at::native::reduce_kernel<512, 1, "
                                   "at::native::ReduceOp<float, at::native::MeanOps<float, float>"),
            DType::f32);
  EXPECT_FALSE(dtype_from_kernel_name("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT"));
  // cuDNN names "f16" for a bf16 attention too (recorded on an H200).
  EXPECT_FALSE(dtype_from_kernel_name(
      "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_"
      "cga1x1x1_kernel0_0"));
  EXPECT_FALSE(dtype_from_kernel_name("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0"));

  // FlashAttention-2: flash_fwd_kernel<Traits, Is_dropout, Is_causal, ...>, as ncu (0/1), the
  // demangler (true/false) and nsys ((bool)1) print it.
  EXPECT_EQ(
      causal_from_kernel_name(
          "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, "
          "64, 64, 4, 0, 0, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, "
          "64, 4, cutlass::bfloat16_t>>, 0, 1, 0, 0, 1, 1, 0>(pytorch_flash::Flash_fwd_params)"),
      true);
  EXPECT_EQ(
      causal_from_kernel_name("void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, "
                              "false, false, cutlass::half_t>, false, false, false, false, "
                              "true, true, false, false>(Flash_fwd_params)"),
      false);
  EXPECT_EQ(causal_from_kernel_name("void pytorch_flash::flash_fwd_splitkv_kernel<Traits<128>, "
                                    "(bool)1, (bool)0, (bool)0>(Flash_fwd_params)"),
            true);
  EXPECT_FALSE(
      causal_from_kernel_name("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_"
                              "fwd_kernel_tra"));
  EXPECT_FALSE(causal_from_kernel_name("fmha_cutlassF_bf16_aligned_64x128_rf_sm80"));

  EXPECT_EQ(short_kernel_name("void at::native::(anonymous namespace)::vectorized_layer_norm_"
                              "kernel<c10::BFloat16, float>(int, float)"),
            "vectorized_layer_norm_kernel");
  EXPECT_EQ(short_kernel_name("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_"
                              "64x64_32x6_tn_align8>(T1::Params)"),
            "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8");
  EXPECT_EQ(short_kernel_name("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::"
                              "FlashAttnFwdSm90<Mainloop<2>>>>(Params)"),
            "FlashAttnFwdSm90");
  EXPECT_EQ(short_kernel_name("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT"),
            "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT");
  EXPECT_EQ(module_class("module::RMSNorm, sizes = [[2, 128, 512], [512]]"), "RMSNorm");
  EXPECT_EQ(module_class("nn.Module: LlamaMLP_12"), "LlamaMLP");
  EXPECT_EQ(module_class("aten::mm"), "");
}

TEST(ClassifyRules, TablesAreWellFormed) {
  for (const auto& rule : context_rules()) {
    EXPECT_FALSE(rule.why.empty()) << rule.id;
    EXPECT_TRUE(rule.op == "other" || find_op(rule.op)) << rule.id;
  }
  for (const auto& rule : kernel_name_rules()) {
    EXPECT_FALSE(rule.why.empty()) << rule.id;
    EXPECT_TRUE(rule.op == "other" || find_op(rule.op)) << rule.id;
  }
}

}  // namespace
}  // namespace kforge
