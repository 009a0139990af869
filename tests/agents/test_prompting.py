"""The history's token estimate, kept as a running sum, and its messages, kept as a list of the
settled turns', agree with counting and building every turn again."""

from agents.catalogue.connections import estimate_tokens
from agents.engine.run.prompting import PLACEHOLDER, History, _messages_of
from agents.engine.run.recorder import CallState
from agents.states import Role


def _call(i: int, result: str = "") -> CallState:
    return CallState(
        call_id=f"c{i}",
        tool="read_file",
        arguments={"path": "a.txt"},
        arguments_raw='{"path": "a.txt"}',
        recovery_class="read_only",
        position=0,
        result_for_model=result,
    )


def _counted(history: History) -> int:
    total = estimate_tokens(history.system.content or "")
    for entry in history.entries:
        total += estimate_tokens(entry.content)
        for c in entry.calls:
            total += estimate_tokens(c.arguments_raw)
            total += estimate_tokens(PLACEHOLDER if c.compacted else c.result_for_model)
    return total


def test_the_estimate_follows_new_turns_results_and_compaction():
    history = History("system " * 50)
    assert history.estimate() == _counted(history)
    history.add_turn(Role.USER, "do it " * 20)
    for i in range(30):
        call = _call(i)
        history.add_turn(Role.ASSISTANT, f"turn {i}", [call])
        assert history.estimate() == _counted(history)
        call.result_for_model = "x" * 4000  # the last turn's call gets its result
        history.touch_last()
        assert history.estimate() == _counted(history)
    before = history.estimate()
    found = history.compact(window=before - 5000, reserve=0)
    assert found is not None
    chosen, estimated_before, after = found
    assert estimated_before == before
    assert after == history.estimate() == _counted(history)
    assert after < before and len(chosen) >= 2
    history.add_turn(Role.ASSISTANT, "the answer")
    assert history.estimate() == _counted(history)


def _built(history: History) -> list:
    out = [history.system]
    for entry in history.entries:
        out.extend(_messages_of(entry))
    return out


def test_the_messages_follow_new_turns_results_and_compaction():
    history = History("system")
    assert history.messages() == _built(history)
    history.add_turn(Role.USER, "do it")
    for i in range(12):
        call = _call(i)
        history.add_turn(Role.ASSISTANT, f"turn {i}", [call])
        assert history.messages() == _built(history)
        call.result_for_model = f"result {i} " * 300  # the last turn's call gets its result
        history.touch_last()
        assert history.messages() == _built(history)
        first = history.messages()
        assert first == history.messages() and first is not history.messages()  # a new list
    found = history.compact(window=history.estimate() - 2000, reserve=0)
    assert found is not None
    messages = history.messages()
    assert messages == _built(history)
    assert sum(PLACEHOLDER in (m.content or "") for m in messages) == len(found[0]) >= 2
    history.add_turn(Role.ASSISTANT, "the answer")
    assert history.messages() == _built(history)
