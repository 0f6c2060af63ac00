"""`SamplingParams`: validation of every field, round-tripping of good values, the order
presets and the stage-name aliases.

Every bad value must raise a `ValueError` (a `ParamError` carrying the field) whose message
names the field and repeats the value received, before any sampling happens. The ranges are
the data of `BOUNDS`, and every float field holds a float32.
"""

import math
import re
from dataclasses import fields

import pytest

from tiny_llm.sampler import SamplingParams
from tiny_llm.sampler.params import BOUNDS, FLOAT32_MAX, FLOAT32_TINY, Bound, ParamError

FLOAT_FIELDS = [
    "temperature", "top_p", "min_p", "typical_p", "top_n_sigma", "xtc_probability",
    "xtc_threshold", "dynatemp_range", "dynatemp_exponent", "repetition_penalty",
    "frequency_penalty", "presence_penalty", "dry_multiplier", "dry_base", "mirostat_tau",
    "mirostat_eta",
]

LLAMA_CPP = ("penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc",
             "temperature")
HF = ("penalties", "temperature", "top_k", "top_p", "min_p", "typical_p")
VLLM = ("penalties", "temperature", "min_p", "top_k", "top_p")
MLX_LM = ("penalties", "top_p", "min_p", "xtc", "top_k", "temperature")


def raises_naming(*parts: str):
    """`pytest.raises(ValueError)` whose message contains every one of `parts` (in any order)."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(p)})" for p in parts)
    return pytest.raises(ValueError, match=pattern)


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_nan_rejected_for_every_float_field(name):
    """NaN is never a valid number: each float field rejects it, naming the field and `nan`."""
    with raises_naming(name, "nan"):
        SamplingParams(**{name: math.nan})


BAD_VALUES = [
    ("top_k", -1),
    ("top_k", -100),
    ("top_k", 2**31),  # held as an int32
    ("top_k", 2.5),
    ("top_p", -0.1),
    ("top_p", 1.1),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("typical_p", -0.5),
    ("typical_p", 1.01),
    ("xtc_probability", -0.1),
    ("xtc_probability", 1.2),
    ("xtc_threshold", -0.1),
    ("dynatemp_range", -0.5),
    ("dynatemp_exponent", -1.0),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.3),
    ("penalty_last_n", -2),
    ("penalty_last_n", 1.5),
    ("dry_multiplier", -0.8),
    ("dry_base", 1.0),
    ("dry_base", 0.5),
    ("dry_allowed_length", 0),
    ("dry_allowed_length", -3),
    ("dry_penalty_last_n", -2),
    ("mirostat", 3),
    ("mirostat", -1),
    ("mirostat_tau", 0.0),
    ("mirostat_tau", -5.0),
    ("mirostat_eta", 0.0),
    ("mirostat_eta", -0.1),
    ("min_tokens", -1),
    ("seed", -1),
    ("seed", 2**32),
    ("logprobs", -1),
]


@pytest.mark.parametrize("name,value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_out_of_range_values_rejected(name, value):
    """Each out-of-range (or wrongly typed) value raises ValueError naming the field and value;
    the field travels as data too, and the message starts with it."""
    with raises_naming(name, repr(value)) as e:
        SamplingParams(**{name: value})
    assert isinstance(e.value, ParamError) and e.value.field == name and str(e.value).startswith(name)
    assert e.value.named("--flag") == "--flag" + str(e.value)[len(name):]


def test_every_number_field_has_its_range_in_bounds():
    """BOUNDS states the range of every number field (mirostat is a choice of 0, 1 or 2), and
    its kind agrees with the field's type."""
    numbers = {f.name: f.type for f in fields(SamplingParams) if f.type in (int, float, int | None)}
    assert set(BOUNDS) == set(numbers) - {"mirostat"}
    assert all(BOUNDS[name].integer == (numbers[name] is not float) for name in BOUNDS)


def _edges(bound: Bound):
    """(value, accepted) pairs at each end of `bound`: the end itself, the next number beyond
    it, and for an excluded minimum the least number above it (a float32 for a float)."""
    beyond = (lambda x, d: x + d) if bound.integer else (lambda x, d: math.nextafter(x, d * math.inf))
    if bound.minimum is not None:
        yield bound.minimum, not bound.above
        yield beyond(bound.minimum, -1), False
        if bound.above:
            yield max(beyond(bound.minimum, 1), 0 if bound.integer else FLOAT32_TINY), True
    if bound.maximum is not None:
        yield bound.maximum, True
        yield beyond(bound.maximum, 1), False


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_the_checks_are_the_bounds(name):
    """Each field accepts exactly its BOUNDS range: at every end, the end (unless excluded)
    and the next number inside pass, the next number outside is a ParamError naming it."""
    bound = BOUNDS[name]
    extra = {"eos_token_ids": (0,)} if name == "min_tokens" else {}
    cases = list(_edges(bound))
    for value, accepted in cases:
        if accepted:
            assert getattr(SamplingParams(**{name: value}, **extra), name) == value
        else:
            with pytest.raises(ParamError, match=rf"^{name} must be in {re.escape(bound.interval())}, got ") as e:
                SamplingParams(**{name: value}, **extra)
            assert e.value.field == name
    assert len(cases) >= 2 or bound == Bound()


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_float_fields_hold_float32s(name):
    """A value inside a float field's range that float32 cannot hold (beyond its largest value,
    or nonzero below its smallest positive one) is refused by SamplingParams itself, as every
    caller (library, command line, batch file, server) then refuses it before anything runs,
    not at draw time with a row error."""
    value = 1e39 if BOUNDS[name].maximum is None else 1e-50
    message = (f"{name} must be a float32 (the sampler's numbers): 0, or between 1.401298464324817e-45 and "
               f"3.4028234663852886e+38 in magnitude, got {value!r}")
    with pytest.raises(ParamError, match=f"^{re.escape(message)}$") as e:
        SamplingParams(**{name: value})
    assert e.value.field == name


def test_temperature_1e_minus_50_is_refused():
    with pytest.raises(ValueError, match=r"^temperature must be a float32"):
        SamplingParams(temperature=1e-50)


@pytest.mark.parametrize("kwargs", [
    dict(temperature=FLOAT32_TINY), dict(temperature=FLOAT32_MAX), dict(top_n_sigma=-FLOAT32_MAX),
    dict(frequency_penalty=-FLOAT32_TINY), dict(presence_penalty=0), dict(repetition_penalty=FLOAT32_TINY),
], ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()))
def test_float32s_at_the_edges_are_accepted(kwargs):
    params = SamplingParams(**kwargs)
    assert {k: getattr(params, k) for k in kwargs} == kwargs


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=10**400), "temperature"),  # an integer beyond any float: refused, not an OverflowError
    (dict(presence_penalty=-(10**400)), "presence_penalty"),
    (dict(top_n_sigma=math.inf), "top_n_sigma"),
    (dict(frequency_penalty=-math.inf), "frequency_penalty"),
    (dict(min_p=math.nextafter(FLOAT32_TINY, 0)), "min_p"),
], ids=["huge-int", "huge-negative-int", "inf", "minus-inf", "below-the-smallest-positive"])
def test_numbers_beyond_float32_are_refused(kwargs, name):
    with pytest.raises(ParamError, match=rf"^{name} must be a float32") as e:
        SamplingParams(**kwargs)
    assert e.value.field == name


def test_logit_bias_negative_token_id_rejected():
    """A negative token id in logit_bias is an error naming logit_bias and the id."""
    with raises_naming("logit_bias", "-4"):
        SamplingParams(logit_bias={-4: 1.0})


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_logit_bias_bad_value_rejected(value):
    """A NaN (or +inf) bias value is an error naming logit_bias, the token and the value."""
    with raises_naming("logit_bias", "7", repr(value)):
        SamplingParams(logit_bias={7: value})


def test_min_tokens_needs_eos_token_ids():
    """min_tokens > 0 without eos_token_ids cannot know what to suppress: ValueError."""
    with raises_naming("min_tokens", "3", "eos_token_ids"):
        SamplingParams(min_tokens=3)
    # With EOS ids it is fine, and min_tokens=0 never needs them.
    assert SamplingParams(min_tokens=3, eos_token_ids=(2,)).min_tokens == 3
    assert SamplingParams(min_tokens=0).eos_token_ids == ()


def test_negative_eos_token_id_rejected():
    """EOS ids are token ids: a negative one is an error naming eos_token_ids and the value."""
    with raises_naming("eos_token_ids", "-2"):
        SamplingParams(eos_token_ids=(1, -2))


@pytest.mark.parametrize("order,bad", [
    ("top_k;banana", "banana"),
    (["top_k", "top_q"], "top_q"),
    ("greedy", "greedy"),
])
def test_unknown_order_name_rejected(order, bad):
    """An unknown stage or preset name in `order` raises ValueError naming `order` and it."""
    with raises_naming("order", bad):
        SamplingParams(order=order)


@pytest.mark.parametrize("order,stage", [
    (["top_k", "top_p", "top_k"], "top_k"),
    ("temperature;min_p;temp", "temperature"),
    (["nucleus", "top_p"], "top_p"),
])
def test_duplicated_stage_rejected(order, stage):
    """A stage named twice (directly or through an alias) in `order` is an error naming it."""
    with raises_naming("order", stage):
        SamplingParams(order=order)


@pytest.mark.parametrize("kwargs,missing", [
    (dict(typical_p=0.5, order="vllm"), "typical_p"),
    (dict(xtc_probability=0.5, xtc_threshold=0.1, order="hf"), "xtc"),
    (dict(dry_multiplier=0.8, order="mlx-lm"), "dry"),
    (dict(top_n_sigma=1.0, order="hf"), "top_n_sigma"),
    (dict(temperature=0.7, order=["top_k", "top_p"]), "temperature"),
    (dict(dynatemp_range=0.5, order="top_k;min_p"), "temperature"),
    (dict(repetition_penalty=1.2, order="top_k;temperature"), "penalties"),
    (dict(presence_penalty=0.5, order="top_k;temperature"), "penalties"),
    (dict(top_k=40, top_p=0.9, order="top_p;temperature"), "top_k"),
])
def test_switched_on_stage_missing_from_order_rejected(kwargs, missing):
    """Parameters that switch a stage on with an order that leaves it out: ValueError naming
    the missing stage (silently skipping it would ignore the user's setting)."""
    with raises_naming(missing):
        SamplingParams(**kwargs)


def test_off_stages_may_be_missing_from_order():
    """Stages at their "off" values need not appear in the order; XTC with a threshold above
    0.5 is off (llama.cpp), so "hf" (no xtc) accepts it."""
    p = SamplingParams(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, order="top_k")
    assert p.order == ("top_k",)
    p = SamplingParams(xtc_probability=1.0, xtc_threshold=0.6, order="hf")
    assert p.order == HF


def test_good_values_round_trip():
    """Every field keeps the valid value it was given (sequences become tuples, bias keys ints)."""
    values = dict(
        temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, typical_p=0.9, top_n_sigma=1.5,
        xtc_probability=0.5, xtc_threshold=0.1, dynatemp_range=0.3, dynatemp_exponent=1.5,
        repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=-0.3, penalty_last_n=32,
        dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=3, dry_penalty_last_n=128,
        mirostat=0, mirostat_tau=4.0, mirostat_eta=0.2, min_tokens=5, seed=1234, logprobs=7,
    )
    p = SamplingParams(
        **values,
        dry_sequence_breakers=["\n", (5, 6), [7]],
        logit_bias={3: 1.5, 9: -math.inf},
        eos_token_ids=[2, 0],
        order=["penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc",
               "temperature"],
    )
    for name, value in values.items():
        assert getattr(p, name) == value, name
    assert p.dry_sequence_breakers == ("\n", (5, 6), (7,))
    assert dict(p.logit_bias) == {3: 1.5, 9: -math.inf}
    assert tuple(p.eos_token_ids) == (2, 0)
    assert tuple(p.order) == LLAMA_CPP


@pytest.mark.parametrize("kwargs", [
    dict(top_p=0.0), dict(top_p=1.0), dict(min_p=0.0), dict(min_p=1.0), dict(typical_p=0.0),
    dict(top_k=0), dict(penalty_last_n=-1), dict(penalty_last_n=0), dict(dry_penalty_last_n=-1),
    dict(dry_allowed_length=1), dict(seed=0), dict(seed=2**32 - 1), dict(mirostat=1),
    dict(mirostat=2), dict(logprobs=0), dict(temperature=0.0),
    dict(xtc_threshold=0.0, xtc_probability=1.0), dict(xtc_threshold=1.0),
    dict(repetition_penalty=1e-3), dict(dry_base=1.0001), dict(top_n_sigma=-1.0),
], ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()))
def test_boundary_values_accepted(kwargs):
    """Values on the edge of each allowed range are valid and kept as given (temperature <= 0
    is greedy per the spec, so 0 and negative temperatures are valid)."""
    p = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(p, name) == value


def test_default_order_is_llama_cpp():
    """No order means llama.cpp's chain, temperature last."""
    assert tuple(SamplingParams().order) == LLAMA_CPP
    assert tuple(SamplingParams(order=None).order) == LLAMA_CPP


@pytest.mark.parametrize("name,stages", [
    ("llama.cpp", LLAMA_CPP), ("hf", HF), ("vllm", VLLM), ("mlx-lm", MLX_LM),
])
def test_presets_resolve(name, stages):
    """Each preset name resolves to its engine's stage order."""
    assert tuple(SamplingParams(order=name).order) == stages


def test_order_string_with_semicolons():
    """`order` accepts llama.cpp's `--samplers` style string."""
    p = SamplingParams(order="top_k;top_p;temperature")
    assert tuple(p.order) == ("top_k", "top_p", "temperature")
    p = SamplingParams(order=["min_p", "penalties"])
    assert tuple(p.order) == ("min_p", "penalties")


@pytest.mark.parametrize("alias,stage", [
    ("top-k", "top_k"), ("top-p", "top_p"), ("nucleus", "top_p"), ("min-p", "min_p"),
    ("typical", "typical_p"), ("typ_p", "typical_p"), ("typical-p", "typical_p"),
    ("temp", "temperature"), ("top-n-sigma", "top_n_sigma"), ("top_nsigma", "top_n_sigma"),
    ("penalty", "penalties"),
])
def test_aliases(alias, stage):
    """Each alias names its stage, alone, in a `;` string and in a list."""
    assert tuple(SamplingParams(order=alias).order) == (stage,)
    other = "dry" if stage != "dry" else "xtc"
    assert tuple(SamplingParams(order=f"{other};{alias}").order) == (other, stage)
    assert tuple(SamplingParams(order=[alias, other]).order) == (stage, other)


def test_aliases_satisfy_switched_on_stages():
    """A stage given by its alias counts as present for the "stage missing" check."""
    p = SamplingParams(top_k=5, top_p=0.9, temperature=0.5, order="top-k;nucleus;temp")
    assert tuple(p.order) == ("top_k", "top_p", "temperature")


@pytest.mark.parametrize("params, message", [
    (SamplingParams(logit_bias={49152: 1.0, 3: -1.0}), "logit_bias names token 49152, outside the vocabulary [0, 49152)"),
    (SamplingParams(eos_token_ids=(7, 60000, 50000)), "eos_token_ids names token 50000, outside the vocabulary"),
    (SamplingParams(dry_sequence_breakers=((5, 49153), "\n")), "dry_sequence_breakers names token 49153"),
], ids=["logit-bias", "eos", "dry-breakers"])
def test_token_ids_outside_the_vocabulary_are_refused(params, message):
    """Checked where the model's vocabulary is known (a request's admission, the CLI after
    loading), before anything runs: the smallest id outside is named."""
    with pytest.raises(ValueError, match=re.escape(message)):
        params.check_vocabulary(49152)


def test_token_ids_inside_the_vocabulary_pass():
    params = SamplingParams(logit_bias={49151: 1.0, 0: -1.0}, eos_token_ids=(0,), dry_sequence_breakers=((49151,),))
    assert params.check_vocabulary(49152) is None


def test_a_single_string_of_sequence_breakers_is_refused():
    """A string is a sequence of characters: "abc" would silently become three breakers."""
    with pytest.raises(ValueError, match=re.escape("got the string 'abc' (write ['abc'])")):
        SamplingParams(dry_sequence_breakers="abc")
    assert SamplingParams(dry_sequence_breakers=["abc"]).dry_sequence_breakers == ("abc",)


@pytest.mark.parametrize("field, value, message", [
    ("order", 5, "order must be a preset name, stage names separated by ';', or a list of stage names, got 5"),
    ("order", {"top_k": 1}, "order must be a preset name"),
    ("logit_bias", [1, 2], "logit_bias must be a mapping of token id to bias, got [1, 2]"),
    ("logit_bias", None, "logit_bias must be a mapping of token id to bias, got None"),
    ("eos_token_ids", 2, "eos_token_ids must be a list of token ids, got 2"),
    ("eos_token_ids", "2", "eos_token_ids must be a list of token ids, got '2'"),
    ("dry_sequence_breakers", 5, "dry_sequence_breakers must be a list of strings or token-id sequences, got 5"),
    ("dry_sequence_breakers", [7], "dry_sequence_breakers entry must be a list of token ids, got 7"),
    ("dry_sequence_breakers", ["\n", None], "dry_sequence_breakers entry must be a list of token ids, got None"),
])
def test_collection_fields_of_the_wrong_type_are_named(field, value, message):
    """A JSON request can carry any type: each field says what it takes instead of a
    TypeError from inside the check."""
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams(**{field: value})
