"""The failed events of one batch job, from the executors' spools to `failed/` (`logs.failed`).

A job parks its spools before any commit (`FailedEvents.park`), then appends those of the pairs
it settles while the status files are written (`FailedEvents.append_settled`), each line exactly
once across crashes. What a pass cut short left behind is taken up by the next one: its journals
and the groups the status files show settled at the start of a pass (`FailedEvents.recover`),
the others once a job reads their destination's load markers (`FailedEvents.recover_parked`), or
when it gives up on a destination it cannot reach (`FailedEvents.settle_unreachable`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from eventspark.batch.load import Fault
from eventspark.batch.partition import NO_TABLE
from eventspark.destinations.base import DestinationAdapter
from eventspark.logs.failed import (
    PENDING_DIR,
    ParkedSpools,
    append_groups,
    appending,
    finish_appends,
    park_spools,
    parked_spools,
    recover_journal,
    remove_groups,
    settle_recovered,
)
from eventspark.logs.status import LogStatus, processed, read_status
from eventspark.logs.store import ParkClaims

log = logging.getLogger(__name__)


class FailedEvents:
    """The failed-event bookkeeping of one job over the logs of `events_dir` (its `failed/` and
    `incoming/`): the groups it parks, and those a crashed pass left, by destination."""

    def __init__(
        self,
        events_dir: Path,
        fault: Fault | None = None,
        status_of: Callable[[str], LogStatus | None] | None = None,
        claims: ParkClaims | None = None,
    ) -> None:
        self.events_dir = events_dir
        self.failed_dir = events_dir / "failed"
        self.fault = fault
        self.status_of = status_of or self._local_status
        """Log name → its status, None when the log is gone (`LogStore.status_of`: the logs may be
        on object storage, while failed/ stays on this node)."""
        self.claims = claims
        """With `log.remote`: the store's claims of this node's parked groups (`ParkClaims`)."""
        self.parked: list[ParkedSpools] = []
        """The groups this job parked (`park`)."""
        self._left: defaultdict[str, list[ParkedSpools]] | None = None

    def recover(self, dest_ids: Collection[str]) -> None:
        """What a pass cut short may have appended to the failed logs of `dest_ids` is undone
        before this pass appends anything; its parked groups that the status files show settled are
        appended (the others wait for a job that reads their destination's load markers). Needs no
        Spark and no connection."""
        if not (self.failed_dir / PENDING_DIR).is_dir():
            return  # nothing parked, no journal: the usual case
        for dest_id in dest_ids:
            if recover_journal(self.failed_dir, dest_id):
                log.info("destination %s: the failed-log appends of a pass cut short were undone", dest_id)
        left = _by_destination(parked_spools(self.failed_dir))
        for dest_id in dest_ids:
            if left[dest_id]:
                self._settle_left(dest_id, left[dest_id], lambda g: True if self._settled(g) else None)

    def recover_parked(self, adapter: DestinationAdapter, dest_id: str) -> None:
        """The groups a crashed pass parked for a destination this job reaches: appended when their
        pair is settled (its load marker, or its log's status file), else dropped (the retry spools
        those events again)."""
        groups = self._take_left(dest_id)
        if not groups:
            return
        committed = adapter.loaded_files(dest_id, sorted({group.log for group in groups}))

        def settled(group: ParkedSpools) -> bool:
            return (group.log, group.table) in committed or self._settled(group)

        done, dropped = self._settle_left(dest_id, groups, settled)
        log.info("destination %s: parked failed-event groups: %d appended, %d dropped", dest_id, done, dropped)

    def settle_unreachable(self, dest_id: str, giving_up: Collection[str]) -> None:
        """The groups a crashed pass parked for a destination this job cannot reach while the logs
        `giving_up` give up on it: no load markers to read, the status files decide. A failed pair of
        a log that gives up now is dropped (its events go to failed/ again, with the give-up reason);
        the other failed pairs stay parked."""

        def settled(group: ParkedSpools) -> bool | None:
            if self._settled(group):
                return True
            return False if group.log in giving_up else None

        self._settle_left(dest_id, self._take_left(dest_id), settled)

    def _settle_left(
        self, dest_id: str, groups: list[ParkedSpools], settled: Callable[[ParkedSpools], bool | None]
    ) -> tuple[int, int]:
        """`settle_recovered`, but a claimed group whose claim another node's pass removed is dropped
        (that pass spooled the same events again: `ParkClaims`); the claims of the groups appended
        or dropped are released."""
        claims = self.claims
        if claims is None:
            return settle_recovered(self.failed_dir, dest_id, groups, settled)
        decided: list[ParkedSpools] = []

        def deciding(group: ParkedSpools) -> bool | None:
            outcome = False if group.claimed and not claims.held(group) else settled(group)
            if outcome is not None:
                decided.append(group)
            return outcome

        counts = settle_recovered(self.failed_dir, dest_id, groups, deciding)
        claims.release(decided)
        return counts

    def park(
        self,
        spools: dict[tuple[str, str, str], list[Path]],
        fresh: set[tuple[str, str]],
        decided: Collection[tuple[str, str, str]] = (),
    ) -> None:
        """Parks the failed events the job may append, before any commit: the spools of every table,
        and the template failures and unreadable lines of the (log, destination) pairs processed for
        the first time (`fresh`: they are written once per log and destination). The other spools
        stay in the job's staging folder, removed with it.

        With `log.remote` the groups are claimed on the store, and every other claim on a pair this
        job decided again (`decided`: the (log, destination, table) its tasks counted, and the
        template failures of `fresh` pairs) is removed: those claims are of passes cut short, whose
        groups this job's outcome supersedes (`ParkClaims`)."""
        claimed = self.claims is not None
        for (name, dest_id, table), found in sorted(spools.items()):
            if table != NO_TABLE or (name, dest_id) in fresh:
                self.parked.append(park_spools(self.failed_dir, name, dest_id, table, found, claimed))
        if self.claims is not None:
            pairs = {(g.log, g.dest_id, g.table) for g in self.parked} | set(decided)
            self.claims.claim(self.parked)
            self.claims.supersede(pairs, keep=self.parked)

    @contextlib.contextmanager
    def append_settled(self, updates: dict[str, LogStatus]) -> Iterator[None]:
        """Around the writes of the status files `updates` comes from (`logs.failed`, steps 2 to
        4): appends the parked groups whose pair is settled and fsyncs the failed logs on entry, and
        retires their journals and groups on a clean exit. Holds the append lock throughout when it
        appends anything: a replay moving a failed log away waits."""
        settled = self._still_claimed(self._settled_groups(updates))
        with appending(self.failed_dir) if settled else contextlib.nullcontext():
            journals = []
            appended: list[ParkedSpools] = []
            for dest_id, groups in sorted(settled.items()):
                journals.append(append_groups(self.failed_dir, dest_id, groups, self.fault))
                appended += groups
            if self.fault is not None:
                self.fault("failed appended")
            yield
            finish_appends(self.failed_dir, journals, appended)
            if self.claims is not None:
                self.claims.release(appended)

    def _settled_groups(self, updates: dict[str, LogStatus]) -> dict[str, list[ParkedSpools]]:
        """The groups parked by this job whose pair `updates` settles, by destination (the others
        stay parked until a job reads their load markers: `recover_parked`)."""
        by_dest: dict[str, list[ParkedSpools]] = defaultdict(list)
        for group in self.parked:
            if group.table != NO_TABLE:  # template failures: parked only when written this pass
                pair = updates.get(group.log, {}).get(group.dest_id, {}).get(group.table)
                if pair is None or not pair.settled:
                    continue
            by_dest[group.dest_id].append(group)
        return by_dest

    def _still_claimed(self, settled: dict[str, list[ParkedSpools]]) -> dict[str, list[ParkedSpools]]:
        """`settled` without the groups whose claim is gone, listed again right now: the pass's lease
        may have lapsed after its fence check, and another node's pass may have decided their pairs
        again and spooled the same events (`ParkClaims`). Those groups are dropped, never appended."""
        claims = self.claims
        if claims is None or not settled:
            return settled
        claims.refresh()
        kept: dict[str, list[ParkedSpools]] = {}
        dropped: list[ParkedSpools] = []
        for dest_id, groups in settled.items():
            kept[dest_id] = [group for group in groups if not group.claimed or claims.held(group)]
            dropped += [group for group in groups if group.claimed and not claims.held(group)]
        if dropped:
            log.warning(
                "%d failed-event group(s) superseded by another node's pass since they were parked: dropped",
                len(dropped),
            )
            remove_groups(dropped)
            self.parked = [group for group in self.parked if group not in dropped]
        return {dest_id: groups for dest_id, groups in kept.items() if groups}

    def _take_left(self, dest_id: str) -> list[ParkedSpools]:
        """The groups a crashed pass left for `dest_id`, once per job (listed on the first call)."""
        if self._left is None:
            self._left = _by_destination(parked_spools(self.failed_dir))
        return self._left.pop(dest_id, [])

    def _settled(self, group: ParkedSpools) -> bool:
        """Whether the status files show the pair of a parked group settled (a log gone from
        incoming/ was archived: settled)."""
        status = self.status_of(group.log)
        if status is None:
            return True
        if group.table == NO_TABLE:
            return processed(status, group.dest_id)
        pair = status.get(group.dest_id, {}).get(group.table)
        return pair is not None and pair.settled

    def _local_status(self, name: str) -> LogStatus | None:
        path = self.events_dir / "incoming" / name
        return read_status(path) if path.exists() else None


def _by_destination(groups: list[ParkedSpools]) -> defaultdict[str, list[ParkedSpools]]:
    by_dest: defaultdict[str, list[ParkedSpools]] = defaultdict(list)
    for group in groups:
        by_dest[group.dest_id].append(group)
    return by_dest
