#!/usr/bin/env python3
"""Writes the hand-made test profiles of this folder (README.md says what each holds).

Run from anywhere: python3 tests/data/profiles/make_profiles.py. The kernel names are real
PyTorch 2.x kernel names (see tests/unit/test_classify.cpp for where they were seen); the
times are chosen, not measured, so that the planner's numbers can be checked by hand.
"""
import json
import os

OUT = os.path.dirname(os.path.abspath(__file__)) + '/'

def prof(source, device, kernels, transfers=(), command=None):
    return {"format":"kforge-profile","version":1,"source":source,
            "command": command or ["python3","python/examples/llama_block.py"],
            "exit_code":0,"region":"all","dropped_records":0,
            "kernel_time_ns": sum(k["end_ns"]-k["start_ns"] for k in kernels),
            "metadata":{"note":"hand-made test profile (tests/data/profiles/README.md)"},
            "devices":[device],"kernels":kernels,"transfers":list(transfers),"ranges":[]}

class Seq:
    def __init__(s, pid, stream, t0=1_000_000, gap=1500):
        s.t=t0; s.pid=pid; s.stream=stream; s.gap=gap; s.ks=[]; s.corr=100
    def k(s, name, us, ctx=(), grid=(1,1,1), block=(128,1,1)):
        ns=int(round(us*1000))
        s.corr+=1
        rec={"name":name,"demangled":name,"grid":list(grid),"block":list(block),"registers":32,
             "static_smem":0,"dynamic_smem":0,"cluster_size":0,"start_ns":s.t,"end_ns":s.t+ns,
             "stream":s.stream,"device":0,"pid":s.pid,"correlation":s.corr,
             "context":[c if isinstance(c,dict) else {"name":c} for c in ctx]}
        s.ks.append(rec); s.t+=ns+s.gap
        return rec

# ---------------------------------------------------------------- profile 1: llama block, NVTX
s=Seq(4242,7)
opid=[100]
def aten(name, sizes, seq=True):
    opid[0]+=1
    txt=name
    if seq: txt+=f", seq = {opid[0]-80}"
    txt+=f", op_id = {opid[0]}, sizes = {sizes}"
    # emit_nvtx(record_shapes=True) appends each input's producer (op id, output index)
    n=len(json.loads(sizes))
    txt+=", input_op_ids = [" + ", ".join(f"({opid[0]-1-i},{i % 2})" for i in range(n)) + "]"
    return txt
def sz(*lists): return "[" + ", ".join("[" + ", ".join(str(x) for x in l) + "]" for l in lists) + "]"

BF='c10::BFloat16'
EW=lambda f: f"void at::native::vectorized_elementwise_kernel<4, {f}, std::array<char*, 3ul> >(int, {f}, std::array<char*, 3ul>)"
EW2=lambda f: f"void at::native::vectorized_elementwise_kernel<4, {f}, std::array<char*, 2ul> >(int, {f}, std::array<char*, 2ul>)"
POW=EW2("at::native::(anonymous namespace)::pow_tensor_scalar_kernel_impl<c10::BFloat16, float>(at::TensorIteratorBase&, float)::{lambda(c10::BFloat16)#1}")
MEAN="void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<float, float, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 4> >(at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<float, float, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 4>)"
ADDS=EW2("at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::CUDAFunctorOnOther_add<c10::BFloat16> >")
RSQRT=EW2("at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#9}::operator()() const::{lambda(c10::BFloat16)#1}")
MUL=EW("at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >")
ADD=EW("at::native::CUDAFunctor_add<c10::BFloat16>")
NEG=EW2("at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#9}::operator()() const::{lambda(c10::BFloat16)#1}")
SILU=EW2("at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}")
CAT="void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 128, 1>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)"
NVJ_QKV="nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT"
NVJ_MLP="nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
NVJ_DOWN="nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN"
CUTLASS_O="void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(T1::Params)"
XMMA="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
FA2="void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 64, 64, 4, 0, 0, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 64, 4, cutlass::bfloat16_t>>, 0, 1, 0, 0, 1, 1, 0>(pytorch_flash::Flash_fwd_params)"
LOGSM="void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)"
NLL="void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<c10::BFloat16, float, long>(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, long const*, c10::BFloat16 const*, bool, long, long, long, long)"
INDEX="void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"
COPY="void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)"
NVJ_SMALL="nvjet_tst_64x8_64x16_4x1_v_bz_TNT"

X=[2,512,1024]
NORM="module::RMSNorm, sizes = " + sz(X,[1024])
def rmsnorm(s):
    s.k(POW,3.2,[NORM, aten("aten::pow", sz(X,[]))])
    s.k(MEAN,4.1,[NORM, aten("aten::mean", sz([2,512,1024],[],[],[]))])
    s.k(ADDS,1.6,[NORM, aten("aten::add", sz([2,512,1],[],[]))])
    s.k(RSQRT,1.5,[NORM, aten("aten::rsqrt", sz([2,512,1]))])
    s.k(MUL,3.0,[NORM, aten("aten::mul", sz(X,[2,512,1]))])
    s.k(MUL,3.2,[NORM, aten("aten::mul", sz([1024],X))])
def linear(s, kernel, us, w, outer=()):
    lin=aten("aten::linear", sz(X,w,[]))
    mat=aten("aten::matmul", sz(X,[w[1],w[0]]), seq=False)
    mm=aten("aten::mm", sz([1024,w[1]],[w[1],w[0]]))
    s.k(kernel, us, list(outer)+[lin, mat, mm])
def add(s):
    s.k(ADD, 2.9, [aten("aten::add", sz(X,X,[]))])

s.k(INDEX,4.0,[aten("aten::embedding", sz([32000,1024],[2,512],[],[],[])), aten("aten::index_select", sz([32000,1024],[],[1024]))])
rmsnorm(s)
linear(s, NVJ_QKV, 14.0, [3072,1024])
ROPE="module::RotaryEmbedding, sizes = " + sz([2,8,512,128],[512,64],[512,64])
for _ in range(2):  # q, then k: two calls of one module back to back
    s.k(MUL,2.4,[ROPE, aten("aten::mul", sz([2,8,512,64],[512,64]))])
    s.k(NEG,1.6,[ROPE, aten("aten::neg", sz([2,8,512,64]))])
    s.k(CAT,2.2,[ROPE, aten("aten::cat", sz([],[]))])
    s.k(MUL,2.4,[ROPE, aten("aten::mul", sz([2,8,512,64],[512,64]))])
    s.k(ADD,2.3,[ROPE, aten("aten::add", sz([2,8,512,64],[2,8,512,64],[]))])
Q=[2,8,512,128]; QS=[2,512,8,128]
sd=aten("aten::scaled_dot_product_attention", sz(Q,Q,Q,[],[],[],[],[]))
fl=aten("aten::_scaled_dot_product_flash_attention", sz(Q,Q,Q,[],[],[],[]))
ff=aten("aten::_flash_attention_forward", sz(QS,QS,QS,[],[],[],[],[],[],[],[],[],[]), seq=False)
s.k(FA2, 12.0, [sd, fl, ff], grid=(4,8,2), block=(128,1,1))
linear(s, CUTLASS_O, 5.2, [1024,1024])
add(s)
rmsnorm(s)
MLP="module::SwiGLU, sizes = " + sz(X,[2816,1024],[2816,1024],[1024,2816])
linear(s, NVJ_MLP, 16.0, [2816,1024], [MLP])
linear(s, NVJ_MLP, 16.0, [2816,1024], [MLP])
s.k(SILU, 4.6, [MLP, aten("aten::silu", sz([2,512,2816]))])
s.k(MUL, 4.4, [MLP, aten("aten::mul", sz([2,512,2816],[2,512,2816]))])
lin=aten("aten::linear", sz([2,512,2816],[1024,2816],[]))
mat=aten("aten::matmul", sz([2,512,2816],[2816,1024]), seq=False)
mm=aten("aten::mm", sz([1024,2816],[2816,1024]))
s.k(NVJ_DOWN, 17.0, [MLP, lin, mat, mm])
add(s)
rmsnorm(s)
linear(s, XMMA, 140.0, [32000,1024])
ce=aten("aten::cross_entropy_loss", sz([1024,32000],[1024],[],[],[],[]))
ls=aten("aten::log_softmax", sz([1024,32000],[],[]))
ls2=aten("aten::_log_softmax", sz([1024,32000],[],[]))
s.k(LOGSM, 60.0, [ce, ls, ls2], grid=(1024,1,1), block=(1024,1,1))
nl=aten("aten::nll_loss_nd", sz([1024,32000],[1024],[],[],[]))
nl2=aten("aten::nll_loss", sz([1024,32000],[1024],[],[],[]))
nl3=aten("aten::nll_loss_forward", sz([1024,32000],[1024],[],[],[]))
s.k(NLL, 25.0, [ce, nl, nl2, nl3], grid=(1,1,1), block=(32,1,1))
s.k(COPY, 3.0, [])
s.k(NVJ_SMALL, 6.0, [])
H100={"id":0,"name":"NVIDIA H100 80GB HBM3","compute_capability":"9.0","sm_count":132}
tr=[{"kind":"HtoD","bytes":8192,"start_ns":900_000,"end_ns":902_000,"stream":7,"device":0,"pid":4242}]
json.dump(prof("cupti",H100,s.ks,tr,["python3","python/examples/llama_block.py","--nvtx"]), open(OUT+'llama_block_nvtx.json','w'), indent=1)
p1=s.ks

# ------------------------------------------------------------- profile 2: torch trace, A100, f16
s=Seq(777,7)
H='c10::Half'
def ctx(name, dims, types): return {"name":name,"input_dims":dims,"input_types":types}
LN="void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::Half, float>(int, float, c10::Half const*, c10::Half const*, c10::Half const*, float*, float*, c10::Half*)"
s.k(LN, 9.0, [ctx("aten::layer_norm", [[4,128,768],[],[768],[768],[],[]], [H,"",H,H,"Double","Bool"]),
              ctx("aten::native_layer_norm", [[4,128,768],[],[768],[768],[]], [H,"",H,H,"Double"])])
GEMM_A="ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn"
s.k(GEMM_A, 30.0, [ctx("aten::addmm", [[2304],[512,768],[768,2304],[],[]], [H,H,H,"Scalar","Scalar"])])
BMM="void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8>(T1::Params)"
SMW="void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 7, false, false>(c10::Half*, c10::Half const*, int, int, int, bool const*, int, bool)"
sdpa=ctx("aten::scaled_dot_product_attention", [[4,12,128,64],[4,12,128,64],[4,12,128,64],[],[],[],[]], [H,H,H,"","Double","Bool",""])
math=ctx("aten::_scaled_dot_product_attention_math", [[4,12,128,64],[4,12,128,64],[4,12,128,64],[],[],[],[],[]], [H,H,H,"","Double","Bool","",""])
s.k(BMM, 12.0, [sdpa, math, ctx("aten::matmul", [[4,12,128,64],[4,12,64,128]], [H,H]), ctx("aten::bmm", [[48,128,64],[48,64,128]], [H,H])])
s.k(SMW, 6.0, [sdpa, math, ctx("aten::_softmax", [[4,12,128,128],[],[]], [H,"Int","Bool"])])
s.k(BMM, 12.0, [sdpa, math, ctx("aten::matmul", [[4,12,128,128],[4,12,128,64]], [H,H]), ctx("aten::bmm", [[48,128,128],[48,128,64]], [H,H])])
SMF="void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::Half, float, c10::Half, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::Half*, c10::Half const*, int)"
for _ in range(2):  # two calls, no call ids: told apart by repetition
    s.k(SMF, 150.0, [ctx("aten::softmax", [[512,50257],[],[]], [H,"Int",""]), ctx("aten::_softmax", [[512,50257],[],[]], [H,"Int","Bool"])], grid=(512,1,1), block=(1024,1,1))
s.k(GEMM_A, 31.0, [ctx("autograd::engine::evaluate_function: AddmmBackward0", [], []), ctx("AddmmBackward0", [], []), ctx("aten::mm", [[512,2304],[2304,768]], [H,H])])
LNG="void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<c10::Half, float>(c10::Half const*, c10::Half const*, float const*, float const*, c10::Half const*, c10::Half*, int)"
GB="void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<c10::Half, float>(long, long, c10::Half const*, c10::Half const*, float const*, float const*, c10::Half*, c10::Half*)"
bw=[ctx("autograd::engine::evaluate_function: NativeLayerNormBackward0", [], []), ctx("NativeLayerNormBackward0", [], []), ctx("aten::native_layer_norm_backward", [[4,128,768],[4,128,768],[],[4,128,1],[4,128,1],[768],[768],[]], [H,H,"",'float','float',H,H,""])]
s.k(LNG, 14.0, bw)
s.k(GB, 10.0, bw)
A100={"id":0,"name":"NVIDIA A100-SXM4-80GB","compute_capability":"8.0","sm_count":108}
json.dump(prof("torch-trace",A100,s.ks,[],["python3","train_gpt2.py"]), open(OUT+'gpt2_torch_trace.json','w'), indent=1)
p2=s.ks

# ------------------------------------------------------------- profile 3: torch.compile, names only
s=Seq(99,7)
for name,us in [("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0",8.0),
                ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT",14.0),
                (FA2,12.0),
                ("triton_tem_fused_mm_0",6.0),
                ("triton_poi_fused_add_3",3.0),
                ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0",8.0),
                ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT",32.0),
                ("triton_poi_fused_mul_silu_2",5.0),
                ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN",17.0),
                ("triton_red_fused__log_softmax_16",40.0),
                ("triton_red_fused_nll_loss_forward_17",4.0)]:
    s.k(name, us, [])
json.dump(prof("cupti",H100,s.ks,[],["python3","python/examples/llama_block.py","--compile"]), open(OUT+'llama_block_compiled.json','w'), indent=1)
p3=s.ks

# ------------------------------------------------------------- profile 4: tiny f32, for tune --task
s=Seq(5,7)
NORM4="module::RMSNorm, sizes = " + sz([4,16,128],[128])
POWF=EW2("at::native::(anonymous namespace)::pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}")
MEANF="void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4>)"
MULF=EW("at::native::binary_internal::MulFunctor<float>")
s.k(POWF, 2.0, [NORM4])
s.k(MEANF, 3.0, [NORM4])
s.k(MULF, 2.0, [NORM4])
s.k("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)", 1.0, [])
json.dump(prof("cupti",H100,s.ks,[],["python3","tiny.py"]), open(OUT+'tiny_rmsnorm_f32.json','w'), indent=1)

ceil=lambda name,copy,mm: {"device":{"backend":"cuda","index":0,"name":name,"uuid":"GPU-test","cc_major":9,"cc_minor":0,"sm_count":132,"total_memory":0,"l2_bytes":0,"max_threads_per_block":1024,"max_shared_per_block":49152,"max_shared_per_sm":0,"regs_per_sm":65536,"regs_per_block":65536,"max_threads_per_sm":2048,"max_blocks_per_sm":32,"reserved_shared_per_block":1024,"warp_size":32,"max_sm_clock_mhz":1980,"driver_version":"test","runtime_version":"test"},
 "ceilings":{"copy_gbps":copy,"matmul_tflops":mm,"matmul_shape":"8192x8192x8192 bf16, fp32 accumulate (cuBLAS)"},"date":"2025-01-01T00:00:00Z"}
json.dump(ceil("NVIDIA H100 80GB HBM3",3000.0,600.0), open(OUT+'ceilings_h100.json','w'), indent=1)
c2=ceil("NVIDIA A100-SXM4-80GB",1700.0,280.0); c2["device"]["cc_major"]=8; c2["device"]["sm_count"]=108
json.dump(c2, open(OUT+'ceilings_a100.json','w'), indent=1)
for name, ks in [("llama_block_nvtx", p1), ("gpt2_torch_trace", p2), ("llama_block_compiled", p3)]:
    print(f"{name}: {len(ks)} kernels, {sum(k['end_ns'] - k['start_ns'] for k in ks)} ns")
