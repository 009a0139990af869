"""What a verdict reads of a finished run: the record (`RunRecord`: the instruction, the answer,
every artifact by name, every tool call; `run_record` reads it in one statement), and the
artifacts' bytes, read by the checks that need them within the verdict's budget (`Budget`). The
check kinds themselves: `agents.engine.verdict.acceptance`; running them over the record:
`agents.engine.verdict.checking`.

**A check that could not see everything does not pass.** Each result is passed, failed or
*unverified* (`CheckResult.unverified`: neither a pass nor a failure; the supervisor sends such a
run to review marked unverified). What a pass of each kind rests on:

=======================  ===========================================================================
kind                     a pass needs
=======================  ===========================================================================
artifact                 one matching name (names are listed from the database, all of them)
no_artifact              every name: a negative check
only_artifacts           every name: a negative check
artifact_contains        every name, and each matching artifact read until the text appears (found
                         in a prefix is found; not found in a cut-off artifact is unverified)
artifact_not_contains    every name, and each matching artifact read in full: a negative check
artifact_matches         every name, and each matching artifact read in full — a match on a prefix
                         is not sound (``\\z``, ``$`` or ``\\A[^<]*\\z`` take the cut for the end)
answer_*                 the whole answer (stored in full)
tool_*                   every tool call of the task (all read)
answer_not_echo          the whole answer
=======================  ===========================================================================

An artifact is read in chunks (`READ_CHUNK`), never whole, for the text checks; a pattern check
holds one artifact's bytes at a time. A check reads at most `RunRecord.read_limit` bytes of one
artifact — the task's `limit_artifact_bytes`, at most `MAX_CHECK_READ_BYTES`; an artifact larger
than that leaves the check unverified unless what was read already decides it (a forbidden text
found is a failure). More than `MAX_ARTIFACT_NAMES` artifacts leave the checks that need every name
unverified. The work of one verdict's checks has a budget (`Budget`): units of work — a byte
scanned for a text counts `SCAN_WEIGHT`, a byte searched by a pattern counts the pattern's RE2
program size — and seconds (`time.monotonic`, looked at before every chunk and every pattern). A
check the budget cannot pay for is unverified, never passed.

Everything here is pure except `run_record`, a selector, and the reading of artifact files by the
checks (after `run_record` has returned: no query runs then).
"""

import codecs
import contextlib
import io
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import IO

from core import fastsql
from tasks.models import Task
from tasks.states import TaskKind
from tasks.workspace import workspace_dir

# What the checks read of a run's artifacts: every name (up to MAX_ARTIFACT_NAMES, far more than
# a run writes), and of each artifact a check needs, up to the task's artifact limit — at most
# MAX_CHECK_READ_BYTES — in chunks of READ_CHUNK.
MAX_ARTIFACT_NAMES = 10_000
MAX_CHECK_READ_BYTES = 8 << 20
READ_CHUNK = 256 * 1024
# The budget of one verdict's checks (`Budget`): units of work and seconds. A byte a pattern
# searches costs the pattern's RE2 program size (the bound of its work per byte: a search of 1 MiB
# with a program of 8,000 instructions took ~5 s when RE2 fell back from its DFA); a byte scanned
# for a text costs SCAN_WEIGHT (measured: decoding, normalising and finding, ~36 ns a byte, what a
# program of ~60 instructions costs).
VERDICT_WORK = 8 << 30
SCAN_WEIGHT = 64
VERDICT_SECONDS = 30.0

# A call that was executed: the tool code ran (or was running when the worker stopped) — as the
# grader counts it.
EXECUTED = frozenset({"running", "succeeded", "failed", "unknown"})


# --- The record a verdict is made over ---------------------------------------------------------


@dataclass(frozen=True)
class CallSeen:
    tool: str
    status: str
    error_code: str = ""
    run_count: int = 0


@dataclass(frozen=True)
class ArtifactFile:
    """An artifact as stored: its file, read by the checks that need its content."""

    path: str
    size: int = 0  # as recorded; what is read is the file itself


# An artifact's content for the checks: its file, its text (a record built in memory), or None
# (not readable text).
ArtifactSource = ArtifactFile | str | None


@dataclass(frozen=True)
class RunRecord:
    """What the checks see of a finished run: the task's instruction and tools, the answer, every
    artifact by name (its content is read by the checks that need it), every tool call with its
    outcome. The evaluation grader's record is this one with the facts it also grades
    (`agents.eval.grading.TaskRecord`)."""

    instruction: str = ""
    answer: str = ""
    tools: tuple[str, ...] = ()
    artifacts: dict[str, ArtifactSource] = field(default_factory=dict)
    calls: tuple[CallSeen, ...] = ()
    input_files: tuple[str, ...] = ()
    # A planning task proposes work; the files and pages its goal names are its follow-ups' job.
    planning: bool = False
    # False: the run has more than MAX_ARTIFACT_NAMES artifacts and `artifacts` holds the first.
    artifacts_complete: bool = True
    # The most a check reads of one artifact (the task's artifact limit, bounded).
    read_limit: int = MAX_CHECK_READ_BYTES

    def text(self, name: str) -> str | None:
        """An artifact's whole text, read through the checks' reader (at most `read_limit`
        bytes, in chunks): None when it is not readable text or goes on past that."""
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        try:
            parts = [
                decoder.decode(data) for data in chunks(self.artifacts.get(name), self.read_limit)
            ]
            parts.append(decoder.decode(b"", final=True))
        except (NotText, Cut, UnicodeDecodeError):
            return None
        return "".join(parts)

    def preview(self, name: str, max_chars: int) -> str | None:
        """The start of an artifact's text, at most `max_chars` characters (None: not readable
        text) — what a person or the model supervisor is shown, never what a check decides on."""
        source = self.artifacts.get(name)
        if source is None or isinstance(source, str):
            return source[:max_chars] if source is not None else None
        try:
            with open_artifact(source) as fh:
                data = fh.read(max_chars * 4)
            # Not final: a prefix cut inside a character is still text.
            return codecs.getincrementaldecoder("utf-8")().decode(data)[:max_chars]
        except (OSError, UnicodeDecodeError):
            return None


#: The verdict's read, one statement: every artifact's name, path and size, in name order (one
#: more than MAX_ARTIFACT_NAMES, to know there were too many), then every tool call in the
#: order it was made.
_RECORD_SQL = """
SELECT part, name, path, size, status, error_code, run_count FROM (
  (SELECT 0 AS part, row_number() OVER (ORDER BY a.name) AS ord, a.name, a.path, a.size,
      NULL::varchar AS status, NULL::varchar AS error_code, NULL::integer AS run_count
    FROM agents_artifact a WHERE a.task_id = %(task)s ORDER BY a.name LIMIT %(names)s)
  UNION ALL
  (SELECT 1, row_number() OVER (ORDER BY t.index, c.position), c.tool, NULL, NULL,
      c.status, c.error_code, c.run_count
    FROM agents_toolcall c JOIN agents_turn t ON t.id = c.turn_id WHERE c.task_id = %(task)s)
) AS seen ORDER BY part, ord"""


def run_record(task: Task, answer: str, *, read: bool = True) -> RunRecord:
    """Read what a verdict needs of `task` from the database: every artifact's name and file (up
    to MAX_ARTIFACT_NAMES), every tool call. No file content: the checks read it afterwards.
    `read=False`: the caller knows the task has made no tool call, so it has no artifact either
    (only a call writes one): nothing to read (the task's input files are still listed)."""
    found = (
        fastsql.execute(_RECORD_SQL, {"task": task.pk, "names": MAX_ARTIFACT_NAMES + 1}).fetchall()
        if read
        else []
    )
    rows = [(name, path, size) for part, name, path, size, *_ in found if part == 0]
    calls = tuple(
        CallSeen(tool=tool, status=status, error_code=error_code, run_count=run_count)
        for part, tool, _, _, status, error_code, run_count in found
        if part == 1
    )
    return RunRecord(
        instruction=task.instruction,
        answer=answer or "",
        tools=tuple(task.tools),
        artifacts={
            name: ArtifactFile(path, size) for name, path, size in rows[:MAX_ARTIFACT_NAMES]
        },
        calls=calls,
        input_files=_input_files(task.pk),
        planning=task.kind == TaskKind.PLANNING,
        artifacts_complete=len(rows) <= MAX_ARTIFACT_NAMES,
        read_limit=min(task.limit_artifact_bytes, MAX_CHECK_READ_BYTES),
    )


def _input_files(task_id: int) -> tuple[str, ...]:
    folder = workspace_dir(task_id, create=False)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.name for p in islice(folder.iterdir(), MAX_ARTIFACT_NAMES)))


# --- Reading an artifact, paid for ------------------------------------------------------------


class Unverified(Exception):
    """What a check needs cannot be seen (or paid for): the check is unverified."""


class NotText(Exception):
    """The artifact is not readable text (not UTF-8, not a regular file, gone)."""


class Cut(Exception):
    """The artifact goes on past what a check reads."""


@dataclass
class Budget:
    """What the checks of one verdict may spend: units of work (a byte scanned for a text costs
    SCAN_WEIGHT, a byte searched by a pattern its RE2 program size) and seconds, measured with
    `time.monotonic` before every chunk and every pattern. What it cannot pay for is unverified."""

    work: int = VERDICT_WORK
    seconds: float = VERDICT_SECONDS
    spent: int = 0
    started: float = field(default_factory=time.monotonic)

    def charge(self, units: int, what: str) -> None:
        if time.monotonic() - self.started >= self.seconds:
            raise Unverified(f"the checks' time budget ({self.seconds:g} s) ran out before {what}")
        if self.spent + units > self.work:
            raise Unverified(
                f"the checks' work budget ({self.work:,} units: bytes read × pattern size) "
                f"cannot pay for {what} ({units:,} units; {self.work - self.spent:,} left)"
            )
        self.spent += units


@contextlib.contextmanager
def open_artifact(source: ArtifactFile | str) -> Iterator[IO[bytes]]:
    """An artifact's bytes: a regular file (opened without following a final link or waiting on
    a pipe), or a text held in memory."""
    if isinstance(source, str):
        yield io.BytesIO(source.encode("utf-8", "surrogatepass"))
        return
    fd = os.open(source.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{source.path} is not a regular file")
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        yield fh


def chunks(source: ArtifactSource, limit: int) -> Iterator[bytes]:
    """An artifact's bytes in chunks of READ_CHUNK, at most `limit` in all, then Cut when the
    artifact goes on; NotText when it cannot be read."""
    if source is None:
        raise NotText
    try:
        with open_artifact(source) as fh:
            read = 0
            while True:
                data = fh.read(min(READ_CHUNK, limit + 1 - read))
                if not data:
                    return
                read += len(data)
                if read > limit:
                    if len(data) > 1:
                        yield data[:-1]
                    raise Cut
                yield data
    except OSError:
        raise NotText from None


def texts(source: ArtifactSource, limit: int, budget: Budget, name: str) -> Iterator[str]:
    """An artifact's text chunk by chunk (whole characters), each chunk paid for first."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    for data in chunks(source, limit):
        budget.charge(len(data) * SCAN_WEIGHT, f"reading {name}")
        try:
            text = decoder.decode(data)
        except UnicodeDecodeError:
            raise NotText from None
        yield text
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise NotText from None
