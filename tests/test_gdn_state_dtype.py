"""gdn_state_dtype: the GDN recurrent state pool in bf16 (half a decode step's state traffic), stepped in fp32."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import pytest
import torch

from engine.interface import SamplingParams
from engine.llm_engine import Engine


def _run(ckpt, **opts):
    eng = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=2, num_blocks=32, **opts)
    prompts = [list(range(5, 30)), list(range(40, 52))]
    outs = eng.generate([dict(prompt_token_ids=p, sampling=SamplingParams(max_tokens=10), ignore_eos=True,
                              keep_logits=True) for p in prompts])
    return eng, outs


def test_bf16_state_pool_close_to_fp32(text_ckpt):
    """The pool is bf16 and the engine's logits stay within bf16 rounding of the state (each step rounds it once)
    of the fp32 pool's over prefill and ten decode steps; a prompt's prefill state is the same rounding of fp32's."""
    eng32, ref = _run(text_ckpt)
    eng16, got = _run(text_ckpt, gdn_state_dtype="bfloat16")
    assert eng32.runner.ssm_state.dtype == torch.float32 and eng16.runner.ssm_state.dtype == torch.bfloat16
    assert eng16.runner.ssm_state.abs().sum() > 0  # the requests wrote their states there
    for r, g in zip(ref, got):
        a, b = torch.stack(list(g.logits)).float(), torch.stack(list(r.logits)).float()
        assert a.shape == b.shape
        rel = float((a - b).norm() / b.norm())
        assert 0 < rel < 2e-2, rel  # not bit-equal (it is rounded) and not far off


def test_bad_state_dtype_refused_naming_the_option(text_ckpt, tmp_path):
    """An unknown dtype, and bf16 with a drafter (the speculative verify steps an fp32 state), fail before loading."""
    from engine.testing import write_random_drafter

    with pytest.raises(ValueError, match="gdn_state_dtype='float16'.*float32, bfloat16"):
        Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=2, num_blocks=32, gdn_state_dtype="float16")
    drafter = write_random_drafter(tmp_path / "d", text_ckpt, block_size=4, seed=1)
    with pytest.raises(ValueError, match="gdn_state_dtype='bfloat16' with a drafter: .* float32 state only"):
        Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=2, num_blocks=32, gdn_state_dtype="bfloat16",
                               speculative=dict(drafter=str(drafter)))
