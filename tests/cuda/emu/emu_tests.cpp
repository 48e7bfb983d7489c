// tests/cuda/emu/emu_tests.cpp — runs the CUDA op files (compiled as C++ against cuda_emu.h) on the CPU and
// compares them with the CPU backend. Not part of the CMake build: tests/cuda/emu/run.sh builds and runs it.
// Inputs are rounded to bf16 first so both sides see identical values; GEMM-like ops use small integers and must
// match exactly; the rest must be within a few bf16 roundings of the CPU's F32 result.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/context.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/ops.h"
#include "core/rng.h"

using namespace dflash;

namespace {

int g_fail = 0, g_pass = 0;

void report(const std::string& name, double err, double tol) {
  const bool ok = err <= tol && std::isfinite(err);
  std::printf("%-58s err %-11.3e tol %-11.3e %s\n", name.c_str(), err, tol, ok ? "PASS" : "FAIL");
  (ok ? g_pass : g_fail)++;
}

// "device" tensors of the emulator are host memory flagged CUDA
Tensor as_dev(Tensor t) {
  t.device = Device::CUDA;
  return t;
}
Tensor as_host(Tensor t) {
  t.device = Device::CPU;
  return t;
}

cuda::Env make_env(int smem_limit = 227 * 1024) {
  cuda::Env e;
  static int err_word = 0;
  e.err_flag = &err_word;
  e.smem_limit = smem_limit;
  e.num_sms = 4;
  static std::vector<unsigned char> workspace(1 << 20);  // (the fields agree, as on the GPU: bytes at workspace)
  e.workspace = workspace.data();
  e.workspace_bytes = workspace.size();
  static cublasLtHandle_t h = nullptr;
  if (!h) cublasLtCreate(&h);
  e.lt = h;
  e.alloc = [](DType t, Shape s) {
    Tensor x = cpu_empty(t, std::move(s));
    if (x.nbytes()) std::memset(x.data, 0xff, x.nbytes());
    return as_dev(x);
  };
  return e;
}

Tensor randn(Shape s, uint64_t seed, double sd = 1.0) {
  Rng r(seed, RngPurpose::Test);
  Tensor t = cpu_empty(DType::F32, std::move(s));
  for (float& x : t.span<float>()) x = round_bf16(static_cast<float>(r.normal() * sd));
  return t;
}
Tensor randint(Shape s, uint64_t seed, int lo, int hi) {
  Rng r(seed, RngPurpose::Test);
  Tensor t = cpu_empty(DType::F32, std::move(s));
  for (float& x : t.span<float>()) x = static_cast<float>(lo + static_cast<int>(r.below(static_cast<uint64_t>(hi - lo + 1))));
  return t;
}
// device copy in dtype dt of a host F32 tensor
Tensor dev(const Tensor& h, DType dt) {
  if (dt == DType::F32) return as_dev(cpu_clone(h));
  if (dt == DType::BF16) return as_dev(cpu_to_bf16(h));
  return as_dev(cpu_clone(h));
}
Tensor dev_i32(const std::vector<int32_t>& v) { return as_dev(cpu_tensor_i32(v, {static_cast<int64_t>(v.size())})); }
Tensor dev_u8(const std::vector<uint8_t>& v) {
  Tensor t = cpu_empty(DType::U8, {static_cast<int64_t>(v.size())});
  std::memcpy(t.data, v.data(), v.size());
  return as_dev(t);
}
std::vector<float> vals(const Tensor& t) { return to_f32_vector(as_host(t)); }

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}
double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

std::unique_ptr<Context> g_cpu;

// ---- GEMMs: exact on integers -------------------------------------------------------------------------------------
void test_linear() {
  cuda::Env e = make_env();
  for (auto [M, N, K] : {std::tuple{5, 7, 3}, std::tuple{33, 17, 64}, std::tuple{64, 48, 40}}) {
    Tensor x = randint({M, K}, 1, -2, 2), w = randint({N, K}, 2, -2, 2), b = randint({N}, 3, -3, 3);
    Tensor y0 = randint({M, N}, 4, -4, 4);
    // linear with bias and beta = 1
    Tensor yc = cpu_clone(y0);
    g_cpu->linear(x, w, &b, yc, 1.0f);
    Tensor yd = dev(y0, DType::BF16), bd = dev(b, DType::BF16);
    cuda::linear(e, dev(x, DType::BF16), dev(w, DType::BF16), &bd, yd, 1.0f, nullptr);
    report(cat("linear+bias beta1 M", M, " N", N, " K", K), max_abs_diff(vals(yd), rounded(vals(yc))), 0);
    // linear_dx: dx = dy w + dx
    Tensor dy = randint({M, N}, 5, -2, 2), dx0 = randint({M, K}, 6, -3, 3);
    Tensor dxc = cpu_clone(dx0);
    g_cpu->linear_dx(dy, w, dxc, 1.0f);
    Tensor dxd = dev(dx0, DType::F32);
    cuda::linear_dx(e, dev(dy, DType::BF16), dev(w, DType::BF16), dxd, 1.0f);
    report(cat("linear_dx beta1 (F32 out) M", M, " N", N, " K", K), max_abs_diff(vals(dxd), vals(dxc)), 0);
    Tensor dxd2 = dev(dx0, DType::BF16);
    cuda::linear_dx(e, dev(dy, DType::BF16), dev(w, DType::BF16), dxd2, 0.0f);
    Tensor dxc2 = cpu_clone(dx0);
    g_cpu->linear_dx(dy, w, dxc2, 0.0f);
    report(cat("linear_dx beta0 (BF16 out) M", M, " N", N, " K", K), max_abs_diff(vals(dxd2), rounded(vals(dxc2))), 0);
    // linear_dw + db
    Tensor dw0 = randint({N, K}, 7, -5, 5), db0 = randint({N}, 8, -5, 5);
    Tensor dwc = cpu_clone(dw0), dbc = cpu_clone(db0);
    g_cpu->linear_dw(dy, x, dwc, &dbc);
    Tensor dwd = dev(dw0, DType::F32), dbd = dev(db0, DType::F32);
    cuda::linear_dw(e, dev(dy, DType::BF16), dev(x, DType::BF16), dwd, &dbd);
    report(cat("linear_dw+db M", M, " N", N, " K", K), std::max(max_abs_diff(vals(dwd), vals(dwc)), max_abs_diff(vals(dbd), vals(dbc))), 0);
  }
}

// ---- row ops ------------------------------------------------------------------------------------------------------
void test_rmsnorm() {
  cuda::Env e = make_env();
  // {7,16} {70,100}: the warp-per-row kernels (D < 64; D % 8 != 0); {6,3584}: D % 8 == 0 but not a power of two
  // (C = 448), the bf16x8 warp-per-row kernels; the rest the row kernels (TPR threads per row, D = 8 TPR CPT): D 64
  // (TPR 8), 128 (16), 256 (32), 512 (64: a shared-memory row sum), 1024 (128), 2048 (256), 4096 (256, CPT 2),
  // 8192 (256, CPT 4); R not a multiple of a step's rows, and (the emulator caps the backward at 3 blocks) blocks
  // of several steps, the last one short.
  for (auto [R, D] : {std::pair{7, 16}, std::pair{70, 100}, std::pair{9, 256}, std::pair{6, 3584}, std::pair{300, 64},
                      std::pair{200, 128}, std::pair{70, 256}, std::pair{100, 512}, std::pair{45, 1024},
                      std::pair{21, 2048}, std::pair{10, 4096}, std::pair{5, 8192}}) {
    Tensor x = randn({R, D}, 10), w = randn({D}, 11, 0.3);
    for (float& v : w.span<float>()) v = round_bf16(v + 1.0f);
    Tensor yc = cpu_empty(DType::F32, {R, D}), rc = cpu_empty(DType::F32, {R});
    g_cpu->rmsnorm(x, w, 1e-6f, yc, rc);
    Tensor yd = e.alloc(DType::BF16, {R, D}), rd = e.alloc(DType::F32, {R});
    cuda::rmsnorm(e, dev(x, DType::BF16), dev(w, DType::BF16), 1e-6f, yd, rd);
    const double ytol = 2 * std::ldexp(max_abs(vals(yc)), -8);
    report(cat("rmsnorm y R", R, " D", D), max_abs_diff(vals(yd), vals(yc)), ytol);
    report(cat("rmsnorm rstd R", R, " D", D), max_abs_diff(vals(rd), vals(rc)), 1e-5 * max_abs(vals(rc)));
    Tensor xi = dev(x, DType::BF16);  // y = x in place, no rstd
    cuda::rmsnorm(e, xi, dev(w, DType::BF16), 1e-6f, xi, Tensor{});
    report(cat("rmsnorm y in place R", R, " D", D), max_abs_diff(vals(xi), vals(yc)), ytol);
    Tensor dy = randn({R, D}, 12), dx0 = randn({R, D}, 13), dw0 = randn({D}, 14);
    Tensor dxc = cpu_clone(dx0), dwc = cpu_clone(dw0);
    g_cpu->rmsnorm_backward(dy, x, w, rc, dxc, dwc, 1.0f);
    Tensor dxd = dev(dx0, DType::BF16), dwd = dev(dw0, DType::F32);
    cuda::rmsnorm_backward(e, dev(dy, DType::BF16), dev(x, DType::BF16), dev(w, DType::BF16), dev(rc, DType::F32), dxd, dwd, 1.0f);
    const double dwtol = 1e-5 * max_abs(vals(dwc)) + 1e-6;
    report(cat("rmsnorm_backward dx R", R, " D", D), max_abs_diff(vals(dxd), vals(dxc)), 2 * std::ldexp(max_abs(vals(dxc)), -8));
    report(cat("rmsnorm_backward dw R", R, " D", D), max_abs_diff(vals(dwd), vals(dwc)), dwtol);
    // beta 0 with dx = dy (in place): with dw, and without (dw undefined)
    Tensor dx0c = cpu_clone(dx0), dw0c = cpu_clone(dw0);
    g_cpu->rmsnorm_backward(dy, x, w, rc, dx0c, dw0c, 0.0f);
    const double dx0tol = 2 * std::ldexp(max_abs(vals(dx0c)), -8);
    Tensor g1 = dev(dy, DType::BF16), dw1 = dev(dw0, DType::F32);
    cuda::rmsnorm_backward(e, g1, dev(x, DType::BF16), dev(w, DType::BF16), dev(rc, DType::F32), g1, dw1, 0.0f);
    report(cat("rmsnorm_backward dx=dy beta0 R", R, " D", D), max_abs_diff(vals(g1), vals(dx0c)), dx0tol);
    report(cat("rmsnorm_backward dx=dy beta0 dw R", R, " D", D), max_abs_diff(vals(dw1), vals(dw0c)), dwtol);
    Tensor g2 = dev(dy, DType::BF16);
    cuda::rmsnorm_backward(e, g2, dev(x, DType::BF16), dev(w, DType::BF16), dev(rc, DType::F32), g2, Tensor{}, 0.0f);
    report(cat("rmsnorm_backward dx=dy beta0 no dw R", R, " D", D), max_abs_diff(vals(g2), vals(dx0c)), dx0tol);
  }
}

// rmsnorm with RopeArgs against the CPU's rmsnorm then rope (backward: rope inverse on dy, then the backward). D 64,
// 128, 256: the row kernels with the RoPE fused (TPR 8, 16, 32; several row slots per warp for 64 and 128; blocks of
// several steps, the last one short); D 96 and 512: the composition (rmsnorm, then rope.cu; a bf16 y / rotated dy in
// between: twice the tolerance).
void test_rmsnorm_rope() {
  cuda::Env e = make_env();
  for (auto [T, Hh, D] : {std::tuple{50, 4, 64}, std::tuple{30, 3, 128}, std::tuple{20, 2, 256}, std::tuple{7, 3, 96},
                          std::tuple{5, 2, 512}}) {
    const int R = T * Hh;
    const bool fused = D <= 256 && (D & (D - 1)) == 0;
    const double f = fused ? 2 : 4;
    Tensor x = randn({R, D}, 30), w = randn({D}, 31, 0.3), dy = randn({R, D}, 32), dx0 = randn({R, D}, 33);
    Tensor dw0 = randn({D}, 34);
    for (float& v : w.span<float>()) v = round_bf16(v + 1.0f);
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; ++t) pos[t] = 97 * t + 3;
    Tensor inv = cpu_empty(DType::F32, {D / 2});
    for (int i = 0; i < D / 2; ++i) inv.ptr<float>()[i] = 1.0f / std::pow(10000.f, 2.f * i / D);
    const RopeArgs rc{cpu_tensor_i32(pos, {T}), inv, Hh}, rd{dev_i32(pos), dev(inv, DType::F32), Hh};
    const std::string nm = cat(" T", T, " heads", Hh, " D", D, fused ? " (fused)" : "");
    Tensor yc = cpu_empty(DType::F32, {R, D}), rsc = cpu_empty(DType::F32, {R});
    g_cpu->rmsnorm(x, w, 1e-6f, yc, rsc);
    g_cpu->rope(yc.reshape({T, Hh, D}), rc.pos, inv, false);
    Tensor yd = e.alloc(DType::BF16, {R, D}), rsd = e.alloc(DType::F32, {R});
    cuda::rmsnorm(e, dev(x, DType::BF16), dev(w, DType::BF16), 1e-6f, yd, rsd, &rd);
    const double ytol = f * std::ldexp(max_abs(vals(yc)), -8);
    report("rmsnorm+rope y" + nm, max_abs_diff(vals(yd), vals(yc)), ytol);
    report("rmsnorm+rope rstd" + nm, max_abs_diff(vals(rsd), vals(rsc)), 1e-5 * max_abs(vals(rsc)));
    Tensor xi = dev(x, DType::BF16);
    cuda::rmsnorm(e, xi, dev(w, DType::BF16), 1e-6f, xi, Tensor{}, &rd);
    report("rmsnorm+rope y in place" + nm, max_abs_diff(vals(xi), vals(yc)), ytol);
    // backward: the CPU's rope inverse on dy, then its backward
    Tensor g = cpu_clone(dy);
    g_cpu->rope(g.reshape({T, Hh, D}), rc.pos, inv, true);
    Tensor dxc = cpu_clone(dx0), dwc = cpu_clone(dw0);
    g_cpu->rmsnorm_backward(g, x, w, rsc, dxc, dwc, 1.0f);
    Tensor dyd = dev(dy, DType::BF16), dxd = dev(dx0, DType::BF16), dwd = dev(dw0, DType::F32);
    cuda::rmsnorm_backward(e, dyd, dev(x, DType::BF16), dev(w, DType::BF16), dev(rsc, DType::F32), dxd, dwd, 1.0f, &rd);
    report("rmsnorm+rope backward dx" + nm, max_abs_diff(vals(dxd), vals(dxc)), f * std::ldexp(max_abs(vals(dxc)), -8));
    report("rmsnorm+rope backward dw" + nm, max_abs_diff(vals(dwd), vals(dwc)),
           fused ? 1e-5 * max_abs(vals(dwc)) + 1e-6 : std::ldexp(max_abs(vals(dwc)), -6));
    report("rmsnorm+rope backward dy kept" + nm, max_abs_diff(vals(dyd), vals(dy)), 0);
    Tensor dx0c = cpu_clone(dx0);
    g_cpu->rmsnorm_backward(g, x, w, rsc, dx0c, Tensor{}, 0.0f);
    Tensor g1 = dev(dy, DType::BF16);
    cuda::rmsnorm_backward(e, g1, dev(x, DType::BF16), dev(w, DType::BF16), dev(rsc, DType::F32), g1, Tensor{}, 0.0f,
                           &rd);
    report("rmsnorm+rope backward dx=dy beta0" + nm, max_abs_diff(vals(g1), vals(dx0c)),
           f * std::ldexp(max_abs(vals(dx0c)), -8));
  }
}

void test_elementwise() {
  cuda::Env e = make_env();
  {  // rope forward then inverse
    const int T = 13, Hh = 3, d = 16;
    Tensor x = randn({T, Hh, d}, 20);
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; ++t) pos[t] = 1000 * t + 7;
    Tensor inv = cpu_empty(DType::F32, {d / 2});
    for (int i = 0; i < d / 2; ++i) inv.ptr<float>()[i] = 1.0f / std::pow(10000.f, 2.f * i / d);
    Tensor xc = cpu_clone(x);
    g_cpu->rope(xc, cpu_tensor_i32(pos, {T}), inv, false);
    Tensor xd = dev(x, DType::BF16);
    cuda::rope(e, xd, dev_i32(pos), dev(inv, DType::F32), false);
    report("rope forward", max_abs_diff(vals(xd), vals(xc)), 2 * std::ldexp(max_abs(vals(xc)), -8));
    g_cpu->rope(xc, cpu_tensor_i32(pos, {T}), inv, true);
    cuda::rope(e, xd, dev_i32(pos), dev(inv, DType::F32), true);
    report("rope inverse", max_abs_diff(vals(xd), vals(xc)), 4 * std::ldexp(max_abs(vals(xc)), -8));
  }
  {
    const int n = 1000;
    Tensor g = randn({10, 100}, 21, 2.0), u = randn({10, 100}, 22), dout = randn({10, 100}, 23);
    Tensor oc = cpu_empty(DType::F32, {10, 100});
    g_cpu->silu_mul(g, u, oc);
    Tensor od = e.alloc(DType::BF16, {10, 100});
    cuda::silu_mul(e, dev(g, DType::BF16), dev(u, DType::BF16), od);
    report("silu_mul", max_abs_diff(vals(od), vals(oc)), 2 * std::ldexp(max_abs(vals(oc)), -8));
    Tensor dgc = cpu_empty(DType::F32, {10, 100}), duc = cpu_empty(DType::F32, {10, 100});
    g_cpu->silu_mul_backward(dout, g, u, dgc, duc);
    Tensor dgd = e.alloc(DType::BF16, {10, 100}), dud = e.alloc(DType::BF16, {10, 100});
    cuda::silu_mul_backward(e, dev(dout, DType::BF16), dev(g, DType::BF16), dev(u, DType::BF16), dgd, dud);
    report("silu_mul_backward", std::max(max_abs_diff(vals(dgd), vals(dgc)), max_abs_diff(vals(dud), vals(duc))),
           2 * std::ldexp(std::max(max_abs(vals(dgc)), max_abs(vals(duc))), -8));
    (void)n;
  }
  {
    Tensor table = randn({50, 24}, 24);
    std::vector<int32_t> ids = {3, 0, 49, 7, 7, 12};
    Tensor oc = cpu_empty(DType::F32, {6, 24});
    g_cpu->embedding(table, cpu_tensor_i32(ids, {6}), oc);
    Tensor od = e.alloc(DType::BF16, {6, 24});
    cuda::embedding(e, dev(table, DType::BF16), dev_i32(ids), od);
    report("embedding", max_abs_diff(vals(od), vals(oc)), 0);
    *e.err_flag = 0;
    std::vector<int32_t> bad = {3, 50};
    Tensor ob = e.alloc(DType::BF16, {2, 24});
    cuda::embedding(e, dev(table, DType::BF16), dev_i32(bad), ob);
    report("embedding bad id sets the error bit", *e.err_flag == cuda::kErrEmbeddingId ? 0 : 1, 0);
    *e.err_flag = 0;
  }
  {
    Tensor y = randn({7, 9}, 25), x = randn({7, 9}, 26);
    Tensor yc = cpu_clone(y);
    g_cpu->add(yc, x, -0.5f);
    Tensor yd = dev(y, DType::F32);
    cuda::add(e, yd, dev(x, DType::F32), -0.5f);
    report("add F32", max_abs_diff(vals(yd), vals(yc)), 0);
    Tensor src = randn({5, 3}, 27), dst = randn({5, 8}, 28);
    Tensor dc = cpu_clone(dst);
    g_cpu->copy_columns(dc, src, 4);
    Tensor dd = dev(dst, DType::BF16);
    cuda::copy_columns(e, dd, dev(src, DType::BF16), 4);
    report("copy_columns", max_abs_diff(vals(dd), vals(dc)), 0);
    Tensor gc = cpu_empty(DType::F32, {5, 3});
    g_cpu->gather_columns(gc, dst, 2);
    Tensor gd = e.alloc(DType::BF16, {5, 3});
    cuda::gather_columns(e, gd, dev(dst, DType::BF16), 2);
    report("gather_columns", max_abs_diff(vals(gd), vals(gc)), 0);
    std::vector<int32_t> rows = {4, 0, 0, 2};
    Tensor rc = cpu_empty(DType::F32, {4, 8});
    g_cpu->gather_rows(rc, dst, cpu_tensor_i32(rows, {4}));
    Tensor rd = e.alloc(DType::F32, {4, 8});
    cuda::gather_rows(e, rd, dev(dst, DType::F32), dev_i32(rows));
    report("gather_rows", max_abs_diff(vals(rd), vals(rc)), 0);
  }
  {
    Tensor x = randn({6, 1000}, 29);
    x.ptr<float>()[2 * 1000 + 5] = 100.f;
    x.ptr<float>()[2 * 1000 + 700] = 100.f;  // tie: first index wins
    Tensor oc = cpu_empty(DType::I32, {6});
    g_cpu->argmax(x, oc);
    Tensor od = e.alloc(DType::I32, {6});
    cuda::argmax(e, dev(x, DType::F32), od);
    int bad = 0;
    for (int r = 0; r < 6; ++r) bad += oc.ptr<int32_t>()[r] != od.ptr<int32_t>()[r];
    report("argmax (with a tie)", bad, 0);
    const double sc = g_cpu->sum_squares(x);
    const double sd = cuda::sum_squares(e, dev(x, DType::F32));
    report("sum_squares", std::fabs(sc - sd) / sc, 1e-12);
    Tensor big = randn({300000}, 30);
    report("sum_squares 300k", std::fabs(g_cpu->sum_squares(big) - cuda::sum_squares(e, dev(big, DType::F32))) / g_cpu->sum_squares(big), 1e-12);
  }
  {
    const int n = 1000;
    Tensor p = randn({n}, 31), g = randn({n}, 32), m = randn({n}, 33, 0.1), v = randn({n}, 34, 0.1);
    for (float& x : v.span<float>()) x = std::fabs(x);
    AdamWArgs a;
    a.lr = 1e-3f;
    a.weight_decay = 0.1f;
    a.grad_scale = 0.7f;
    a.step = 3;
    Tensor pc = cpu_clone(p), mc = cpu_clone(m), vc = cpu_clone(v);
    g_cpu->adamw(pc, g, mc, vc, a, Tensor{});
    Tensor pd = dev(p, DType::F32), md = dev(m, DType::F32), vd = dev(v, DType::F32), cd = e.alloc(DType::BF16, {n});
    cuda::adamw(e, pd, dev(g, DType::F32), md, vd, a, cd);
    report("adamw (bitwise)", std::max({max_abs_diff(vals(pd), vals(pc)), max_abs_diff(vals(md), vals(mc)), max_abs_diff(vals(vd), vals(vc))}), 0);
    report("adamw compute copy", max_abs_diff(vals(cd), rounded(vals(pc))), 0);
  }
}

// ---- attention ----------------------------------------------------------------------------------------------------
void test_causal(int Tq, int Tk, int nh, int nkv, int d, int smem) {
  cuda::Env e = make_env(smem);
  const int64_t q_offset = Tk - Tq;
  Tensor q = randn({Tq, nh, d}, 40), k = randn({Tk, nkv, d}, 41), v = randn({Tk, nkv, d}, 42);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Tensor oc = cpu_empty(DType::F32, {Tq, nh, d});
  g_cpu->attention_causal(q, k, v, oc, q_offset, scale);
  Tensor od = e.alloc(DType::BF16, {Tq, nh, d});
  cuda::attention_causal(e, dev(q, DType::BF16), dev(k, DType::BF16), dev(v, DType::BF16), od, q_offset, scale);
  report(cat("attention_causal Tq", Tq, " Tk", Tk, " nh", nh, "/", nkv, " d", d, " smem", smem / 1024, "K"),
         max_abs_diff(vals(od), vals(oc)), 2 * std::ldexp(max_abs(vals(oc)), -8));
}

void test_dflash(int S, int N, int B, int nh, int nkv, int d, std::vector<int32_t> anchors, std::vector<uint8_t> valid,
                 int smem, const std::string& label, int window = 0) {
  cuda::Env e = make_env(smem);
  const int NB = N * B;
  Tensor q = randn({NB, nh, d}, 50), kc = randn({S, nkv, d}, 51), vc = randn({S, nkv, d}, 52);
  Tensor kb = randn({NB, nkv, d}, 53), vb = randn({NB, nkv, d}, 54), dout = randn({NB, nh, d}, 55);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  DFlashAttnArgs ac{q, kc, vc, kb, vb, cpu_tensor_i32(anchors, {N}), Tensor{}, B, scale, window};
  ac.valid = cpu_empty(DType::U8, {N});
  std::memcpy(ac.valid.data, valid.data(), N);
  Tensor oc = cpu_empty(DType::F32, {NB, nh, d}), lc = cpu_empty(DType::F32, {NB, nh});
  g_cpu->dflash_attention(ac, oc, lc);
  DFlashAttnArgs ad{dev(q, DType::BF16), dev(kc, DType::BF16), dev(vc, DType::BF16), dev(kb, DType::BF16),
                    dev(vb, DType::BF16), dev_i32(anchors), dev_u8(valid), B, scale, window};
  Tensor od = e.alloc(DType::BF16, {NB, nh, d}), ld = e.alloc(DType::F32, {NB, nh});
  cuda::dflash_attention(e, ad, od, ld);
  const std::string name = cat("dflash S", S, " N", N, " B", B, " nh", nh, "/", nkv, " d", d, window ? cat(" W", window) : "",
                               " ", label, " smem", smem / 1024, "K");
  report(name + " out", max_abs_diff(vals(od), vals(oc)), 2 * std::ldexp(max_abs(vals(oc)), -8));
  {
    auto a = vals(ld), b = vals(lc);
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isinf(b[i]) || std::isinf(a[i])) {
        if (a[i] != b[i]) m = INFINITY;
      } else {
        m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
      }
    }
    report(name + " lse", m, 1e-4);
  }
  // backward on identical inputs: out rounded to bf16, lse from the CPU
  Tensor ob = cpu_to_f32(cpu_to_bf16(oc));
  Tensor gq = cpu_empty(DType::F32, {NB, nh, d}), gkc = cpu_empty(DType::F32, {S, nkv, d}),
         gvc = cpu_empty(DType::F32, {S, nkv, d}), gkb = cpu_empty(DType::F32, {NB, nkv, d}),
         gvb = cpu_empty(DType::F32, {NB, nkv, d});
  g_cpu->dflash_attention_backward(ac, ob, lc, dout, gq, gkc, gvc, gkb, gvb);
  Tensor dq = e.alloc(DType::BF16, {NB, nh, d}), dkc = e.alloc(DType::BF16, {S, nkv, d}),
         dvc = e.alloc(DType::BF16, {S, nkv, d}), dkb = e.alloc(DType::BF16, {NB, nkv, d}),
         dvb = e.alloc(DType::BF16, {NB, nkv, d});
  cuda::dflash_attention_backward(e, ad, dev(ob, DType::BF16), dev(lc, DType::F32), dev(dout, DType::BF16), dq, dkc, dvc,
                                  dkb, dvb);
  for (auto [nm, gd, gc] : {std::tuple{"dq", dq, gq}, std::tuple{"dk_ctx", dkc, gkc}, std::tuple{"dv_ctx", dvc, gvc},
                            std::tuple{"dk_blk", dkb, gkb}, std::tuple{"dv_blk", dvb, gvb}}) {
    const auto c = vals(gc);
    report(name + " " + nm, max_abs_diff(vals(gd), c), 3 * std::ldexp(max_abs(c), -8) + 1e-6);
  }
  if (*e.err_flag) report(name + " error bits", *e.err_flag, 0);
}

void test_attention() {
  test_causal(5, 5, 2, 1, 8, 227 * 1024);
  test_causal(16, 17, 4, 2, 64, 227 * 1024);
  test_causal(3, 40, 6, 2, 128, 227 * 1024);
  test_causal(33, 70, 4, 4, 128, 48 * 1024);
  test_causal(20, 20, 4, 2, 256, 227 * 1024);
  test_causal(20, 45, 2, 2, 200, 40 * 1024);
  // DFlash: anchors at 0 and S-2, a padding block, several tiles of context, GQA 4/2
  test_dflash(21, 5, 4, 4, 2, 8, {5, 8, 12, 18, 0}, {1, 1, 1, 1, 0}, 227 * 1024, "tiny");
  test_dflash(40, 3, 4, 4, 2, 8, {0, 20, 38}, {1, 1, 1}, 227 * 1024, "anchors 0,S-2");
  test_dflash(150, 4, 16, 4, 2, 64, {3, 70, 100, 148}, {1, 1, 1, 1}, 227 * 1024, "D64");
  test_dflash(150, 4, 16, 4, 2, 64, {3, 70, 100, 148}, {1, 1, 1, 1}, 28 * 1024, "D64 small smem");
  test_dflash(90, 3, 16, 8, 2, 128, {0, 45, 88}, {1, 0, 1}, 227 * 1024, "D128 padding middle");
  test_dflash(70, 2, 16, 3, 1, 128, {64, 68}, {1, 1}, 40 * 1024, "D128 rep3");
  test_dflash(1, 1, 16, 2, 1, 64, {0}, {1}, 227 * 1024, "(16,1)");
  test_dflash(17, 1, 16, 2, 1, 64, {15}, {1}, 227 * 1024, "(16,17)");
  test_dflash(128, 1, 127, 2, 2, 64, {126}, {1}, 227 * 1024, "(127,128) one block");
  test_dflash(130, 3, 43, 2, 1, 64, {10, 60, 128}, {1, 1, 1}, 227 * 1024, "(129,130)");
  test_dflash(40, 2, 4, 2, 1, 256, {7, 30}, {1, 1}, 227 * 1024, "D256");
  test_dflash(40, 2, 4, 2, 1, 256, {7, 30}, {1, 1}, 36 * 1024, "D256 small smem");
  test_dflash(12, 2, 4, 2, 1, 8, {0, 0}, {0, 0}, 227 * 1024, "all padding");
  // sliding-window layers (spec 2.3): context keys [a_j + i - (W-1), a_j), causal within the block; W smaller than,
  // equal to and larger than B, windows that start inside a tile, a padding block
  test_dflash(150, 4, 16, 4, 2, 64, {3, 70, 100, 148}, {1, 1, 1, 1}, 227 * 1024, "window", 5);
  test_dflash(150, 4, 16, 4, 2, 64, {3, 70, 100, 148}, {1, 0, 1, 1}, 28 * 1024, "window small smem", 40);
  test_dflash(90, 3, 16, 8, 2, 128, {0, 45, 88}, {1, 1, 1}, 227 * 1024, "window", 16);
  test_dflash(21, 5, 4, 4, 2, 8, {5, 8, 12, 18, 0}, {1, 1, 1, 1, 0}, 227 * 1024, "window", 3);
  test_dflash(40, 2, 4, 2, 1, 256, {7, 30}, {1, 1}, 227 * 1024, "window", 1);
}

void test_loss() {
  cuda::Env e = make_env();
  const int R = 12, H = 16, V = 301, Rs = 7;
  Tensor h = randn({R, H}, 60), W = randn({V, H}, 61, 0.5), th = randn({Rs, H}, 62);
  // small integers: every logit (|z| <= 2 x 1 x H) is exact in bf16, so the device's rounding of the logits to bf16
  // (lm_head_loss.cu) changes nothing and ce / kl are checked at fp32 tolerances
  for (Tensor* t : {&h, &W, &th}) {
    const float lim = t == &W ? 1.f : 2.f;
    for (float& x : t->span<float>()) x = std::clamp(std::round(x), -lim, lim);
  }
  std::vector<int32_t> rows = {0, 3, 4, 5, 9, 10, 11}, labels = {1, 300, 7, 7, 0, 150, 42};
  std::vector<float> w = {1.f, 0.5f, 0.25f, 1.f, 0.8f, 0.3f, 0.9f};
  for (bool teacher : {false, true})
    for (int chunk : {1, 3, 1024}) {
      LossArgs lc;
      lc.h = h;
      lc.lm_head = W;
      lc.rows = cpu_tensor_i32(rows, {Rs});
      lc.labels = cpu_tensor_i32(labels, {Rs});
      lc.weights = cpu_tensor(w, {Rs});
      lc.teacher_h = teacher ? th : Tensor{};
      lc.kl_weight = 0.3f;
      lc.grad_scale = 0.2f;
      lc.chunk_rows = chunk;
      lc.dh = cpu_zeros(DType::F32, {R, H});
      LossStats sc = g_cpu->lm_head_loss(lc);
      LossArgs ld = lc;
      ld.h = dev(h, DType::BF16);
      ld.lm_head = dev(W, DType::BF16);
      ld.rows = dev_i32(rows);
      ld.labels = dev_i32(labels);
      ld.weights = dev(lc.weights, DType::F32);
      ld.teacher_h = teacher ? dev(th, DType::BF16) : Tensor{};
      ld.dh = dev(cpu_zeros(DType::F32, {R, H}), DType::BF16);
      LossStats sd = cuda::lm_head_loss(e, ld);
      double ece = 0, ekl = 0;
      int bad = 0;
      for (int r = 0; r < Rs; ++r) {
        ece = std::max(ece, std::fabs(sc.ce[r] - sd.ce[r]));
        ekl = std::max(ekl, std::fabs(sc.kl[r] - sd.kl[r]));
        bad += sc.correct[r] != sd.correct[r];
      }
      const std::string nm = cat("lm_head_loss teacher ", teacher, " chunk ", chunk);
      report(nm + " ce", ece, 1e-4);
      report(nm + " kl", ekl, 1e-4);
      report(nm + " correct", bad, 0);
      const auto c = vals(lc.dh);
      report(nm + " dh", max_abs_diff(vals(ld.dh), c), 4 * std::ldexp(max_abs(c), -8));
    }
}

}  // namespace

int main(int argc, char** argv) {
  g_cpu = make_context("cpu", {.threads = 2});
  const std::string only = argc > 1 ? argv[1] : "";
  auto want = [&](const char* s) { return only.empty() || only == s; };
  setvbuf(stdout, nullptr, _IONBF, 0);
  auto guarded = [&](const char* name, void (*f)()) {
    if (!want(name)) return;
    try {
      f();
    } catch (const std::exception& e) {
      std::printf("%s: exception: %s\n", name, e.what());
      ++g_fail;
    }
  };
  guarded("linear", test_linear);
  guarded("rmsnorm", test_rmsnorm);
  guarded("rmsnorm", test_rmsnorm_rope);
  guarded("elementwise", test_elementwise);
  guarded("attention", test_attention);
  guarded("loss", test_loss);
  if (want("config")) {
    for (int d : {64, 128, 256, 512})
      for (int lim : {227 * 1024, 48 * 1024, 24 * 1024, 8 * 1024})
        std::printf("config d %d limit %d: %s\n", d, lim, cuda::attention_config(d, lim).c_str());
  }
  std::printf("emu: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
