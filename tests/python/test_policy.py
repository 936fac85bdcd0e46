"""moeinfer.Policy: the scheduling policy's defaults, attributes and offload specs
(moe_sched_policy_init / moe_sched_policy_parse_offload through the bindings). No model needed."""

from __future__ import annotations

import copy

import pytest

import moeinfer

OPS = ("mul_mat", "mul_mat_id", "moe_up_gate")


def test_defaults():
    p = moeinfer.Policy()
    assert p.offload == {op: (True, -1) for op in OPS}
    assert p.expert_copy == "auto"
    assert p.bias_dup is True
    assert p.offload_vram_budget == 0
    assert p.expert_split == -1  # automatic
    assert p.expert_cache == -1  # automatic


def test_parse_offload_applies_entries_in_order():
    p = moeinfer.Policy().parse_offload("all=off,mul_mat_id=512")
    assert p.offload["mul_mat_id"] == (True, 512)
    assert p.offload["mul_mat"][0] is False and p.offload["moe_up_gate"][0] is False
    # "on" restores the default threshold; a number sets it.
    p.parse_offload("moe_up_gate=on,mul_mat=0")
    assert p.offload["moe_up_gate"] == (True, -1)
    assert p.offload["mul_mat"] == (True, 0)
    assert p.parse_offload("all=7") is p  # returns the policy itself, for chaining
    assert p.offload == {op: (True, 7) for op in OPS}


@pytest.mark.parametrize("spec, needle", [
    ("bogus=4", "bogus"),
    ("mul_mat=-3", "-3"),
    ("mul_mat_id=abc", "abc"),
    ("mul_mat=4,moe_up_gate=-1", "-1"),
    ("mul_mat_id", "mul_mat_id"),
])
def test_parse_offload_errors_name_the_entry_and_change_nothing(spec, needle):
    p = moeinfer.Policy().parse_offload("mul_mat=9")
    before = copy.copy(p)
    with pytest.raises(ValueError) as e:
        p.parse_offload(spec)
    assert needle in str(e.value)
    assert p == before and p.offload["mul_mat"] == (True, 9)


def test_constructor_arguments():
    p = moeinfer.Policy(offload="mul_mat=off", expert_copy="active", bias_dup=False, offload_vram_budget=1 << 20)
    assert p.offload["mul_mat"][0] is False and p.offload["mul_mat_id"] == (True, -1)
    assert p.expert_copy == "active" and p.bias_dup is False and p.offload_vram_budget == 1 << 20
    q = moeinfer.Policy(offload={"mul_mat": (False, -1)}, expert_copy="active", bias_dup=False,
                        offload_vram_budget=1 << 20)
    assert p == q
    assert p != moeinfer.Policy()
    assert moeinfer.Policy(expert_split=3) != moeinfer.Policy()
    r = moeinfer.Policy(expert_split=0)
    assert r.expert_split == 0 and eval(repr(r), {"moeinfer": moeinfer}) == r
    c = moeinfer.Policy(expert_cache=1 << 30, expert_copy="auto")
    assert c.expert_cache == 1 << 30 and c != moeinfer.Policy() and eval(repr(c), {"moeinfer": moeinfer}) == c
    # repr spells a policy that builds an equal one.
    assert eval(repr(p), {"moeinfer": moeinfer}) == p


def test_attribute_validation():
    p = moeinfer.Policy()
    with pytest.raises(ValueError, match="'fast'"):
        p.expert_copy = "fast"
    with pytest.raises(ValueError, match="matmul"):
        p.offload = {"matmul": (True, 4)}
    with pytest.raises(ValueError, match="-2"):
        p.set_offload("mul_mat", True, -2)
    with pytest.raises(TypeError):
        p.offload = {"mul_mat": 4}
    with pytest.raises(ValueError, match="'fast'"):
        moeinfer.Policy(expert_copy="fast")
    with pytest.raises(ValueError, match="expert_cache"):
        p.expert_cache = -5
    with pytest.raises(ValueError, match="nope"):
        moeinfer.Policy(offload="nope=1")
    with pytest.raises(ValueError, match="expert_split"):
        p.expert_split = -2
    with pytest.raises(ValueError, match="-5"):
        moeinfer.Policy(expert_split=-5)
    assert p == moeinfer.Policy()  # nothing changed by the failed assignments
    p.set_offload("moe_up_gate", False)
    p.offload = {"mul_mat_id": (True, 64)}
    assert p.offload == {"mul_mat": (True, -1), "mul_mat_id": (True, 64), "moe_up_gate": (False, -1)}
