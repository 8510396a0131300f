"""The element-wise Triton kernels (RMSNorm, SiLU-and-mul, rotary, KV-cache store) against the
torch code they replace. Without a GPU they run in Triton's interpreter on CPU tensors (see the
root conftest.py), so the shapes are small and odd; with CUDA the same tests also run there
(`python -m pytest -m gpu tests/test_kernels_elementwise.py`)."""
import pytest
import torch

from minivllm.attention.torch_ref import store_kv as store_kv_ref
from minivllm.kernels.rmsnorm import rms_norm
from minivllm.kernels.rotary import apply_rotary_
from minivllm.kernels.silu_and_mul import silu_and_mul
from minivllm.kernels.store_kv import store_kv
from minivllm.layers.basic import RMSNorm, RotaryEmbedding
from minivllm.layers.basic import silu_and_mul as silu_and_mul_ref

DTYPES = [torch.float32, torch.bfloat16]


def tol(dtype, device):
    """float32: tight. bfloat16: a couple of ulps (2**-8 relative each), because the kernels sum in
    another order and round once where torch rounds twice; in Triton's interpreter a little more,
    because it converts float32 to bfloat16 by truncating instead of rounding to nearest."""
    if dtype == torch.float32:
        return dict(atol=1e-5, rtol=1e-5)
    return dict(atol=1e-2, rtol=1.6e-2 if device == "cuda" else 3e-2)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def device(request):
    if request.param == "cpu" and torch.cuda.is_available():
        pytest.skip("Triton runs on CPU tensors only in its interpreter, which is off when CUDA is there")
    return request.param


def packed_qkv(T, hq, hkv, d, dtype, device):
    """q, k, v as the attention layer gets them: strided views of one [T, (Hq + 2 Hkv) * D] tensor."""
    qkv = torch.randn(T, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", [(1, 64), (3, 100), (17, 96)])
def test_rms_norm(device, dtype, T, H):
    torch.manual_seed(T * H)
    norm = RMSNorm(H, eps=1e-5).to(device, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(H))
        x = torch.randn(T, H, dtype=dtype, device=device) * 3
        residual = torch.randn(T, H, dtype=dtype, device=device)
        x_before, residual_before = x.clone(), residual.clone()

        torch.testing.assert_close(rms_norm(x, norm.weight, norm.eps), norm(x), **tol(dtype, device))
        out, new_residual = rms_norm(x, norm.weight, norm.eps, residual)
        ref_out, ref_residual = norm(x, residual)
    torch.testing.assert_close(out, ref_out, **tol(dtype, device))
    torch.testing.assert_close(new_residual, ref_residual, **tol(dtype, device))
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # inputs left alone


def test_rms_norm_strided_rows(device):
    """Rows with a stride wider than H (a slice of a wider tensor) are read where they are."""
    torch.manual_seed(0)
    norm = RMSNorm(40).to(device)
    x = torch.randn(5, 64, device=device)[:, 8:48]
    with torch.no_grad():
        torch.testing.assert_close(rms_norm(x, norm.weight, norm.eps), norm(x), **tol(torch.float32, device))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,I", [(1, 64), (3, 100), (17, 96), (2, 1500)])  # 1500: more than one block
def test_silu_and_mul(device, dtype, T, I):
    torch.manual_seed(T * I)
    gate_up = torch.randn(T, 2 * I, dtype=dtype, device=device) * 4
    torch.testing.assert_close(silu_and_mul(gate_up), silu_and_mul_ref(gate_up), **tol(dtype, device))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,hq,hkv,d", [(1, 4, 2, 64), (3, 3, 1, 32), (17, 6, 2, 48)])  # 48: D/2 not a power of 2
def test_apply_rotary(device, dtype, T, hq, hkv, d):
    torch.manual_seed(T * hq * d)
    rotary = RotaryEmbedding(d, max_positions=256, theta=10000.0).to(device)
    q, k, _ = packed_qkv(T, hq, hkv, d, dtype, device)
    assert T == 1 or not (q.is_contiguous() or k.is_contiguous())  # one token: torch calls any view contiguous
    positions = torch.randint(200, 256, (T,), device=device)  # far along: large angles
    positions[0] = 0
    ref_q, ref_k = rotary(positions, q, k)
    out_q, out_k = apply_rotary_(positions, q, k, rotary.cos, rotary.sin)
    assert out_q is q and out_k is k
    torch.testing.assert_close(q, ref_q, **tol(dtype, device))
    torch.testing.assert_close(k, ref_k, **tol(dtype, device))


def test_apply_rotary_leaves_v_alone(device):
    """Rotating q and k in place must not touch v, the next columns of the same packed tensor."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(32, max_positions=64, theta=10000.0).to(device)
    q, k, v = packed_qkv(5, 3, 1, 32, torch.float32, device)
    v_before = v.clone()
    apply_rotary_(torch.arange(5, device=device), q, k, rotary.cos, rotary.sin)
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,hkv,d,block_size", [(1, 2, 64, 16), (3, 1, 32, 4), (17, 3, 48, 8)])
def test_store_kv(device, dtype, T, hkv, d, block_size):
    torch.manual_seed(T * hkv * d)
    _, k, v = packed_qkv(T, 2, hkv, d, dtype, device)
    assert T == 1 or not (k.is_contiguous() or v.is_contiguous())
    num_blocks = 6
    k_cache = torch.randn(num_blocks, block_size, hkv, d, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    slot_mapping = torch.randperm(num_blocks * block_size, device=device)[:T]  # distinct, scattered slots
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(k, v, ref_k, ref_v, slot_mapping)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    # a copy: bit for bit, whatever the dtype
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_store_kv_skips_negative_slots(device):
    torch.manual_seed(0)
    T, hkv, d, block_size = 7, 2, 32, 4
    _, k, v = packed_qkv(T, 2, hkv, d, torch.float32, device)
    k_cache = torch.randn(4, block_size, hkv, d, device=device)
    v_cache = torch.randn_like(k_cache)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    slot_mapping = torch.tensor([5, -1, 0, 13, -1, -1, 9], device=device)  # -1: padding (CUDA graphs)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    real = slot_mapping >= 0
    ref_k, ref_v = k_before.clone(), v_before.clone()
    store_kv_ref(k[real], v[real], ref_k, ref_v, slot_mapping[real])
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)  # padding rows wrote nothing
    untouched = torch.ones(4 * block_size, dtype=torch.bool, device=device)
    untouched[slot_mapping[real]] = False
    assert torch.equal(k_cache.view(-1, hkv, d)[untouched], k_before.view(-1, hkv, d)[untouched])
