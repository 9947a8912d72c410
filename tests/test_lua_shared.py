"""Code that several Lua scripts share lives in one ``lua/_NAME.lua`` and is joined by ``--@include NAME``: a fix
to it cannot miss a copy."""

from __future__ import annotations

from importlib import resources

from ringfence.redis.scripts import script

LUA = resources.files("ringfence.redis").joinpath("lua")
COUNTERS = ("ack", "dead", "retry", "advance")  # the scripts that count finished or failed jobs per minute


def test_per_minute_is_written_once_and_joined_into_each_script_that_counts() -> None:
    defining = sorted(f.name for f in LUA.iterdir()
                      if f.name.endswith(".lua") and "function per_minute(" in f.read_text())
    assert defining == ["_per_minute.lua"]
    for name in COUNTERS:
        source = script(name).source
        assert source.count("local function per_minute(") == 1, name
        assert source.index("local function per_minute(") < source.index("per_minute(KEYS"), name


def test_the_breaker_transition_is_written_once_and_joined_into_both_breaker_scripts() -> None:
    defining = sorted(f.name for f in LUA.iterdir() if f.name.endswith(".lua") and "function move(" in f.read_text())
    assert defining == ["_breaker.lua"]
    for name in ("breaker_allow", "breaker_record"):
        source = script(name).source
        assert source.count("local function move(") == 1, name
        assert source.index("local function move(") < source.index("state = move(b, KEYS[2], state, "), name


def test_a_workflow_steps_ack_is_written_once_and_joined_into_both_step_scripts() -> None:
    defining = sorted(f.name for f in LUA.iterdir()
                      if f.name.endswith(".lua") and "function ack_step(" in f.read_text())
    assert defining == ["_ack_step.lua"]
    for name in ("advance", "wf_ack"):
        source = script(name).source
        assert source.count("local function ack_step(") == 1, name
        assert source.index("local function per_minute(") < source.index("local function ack_step(") < source.index(
            "if not ack_step(id, ARGV[4], now) then return -1 end"), name
