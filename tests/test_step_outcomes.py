"""Each verb's report ends a step the same way: ``outcome()`` -> (ok | changed, reason), or StepFailed.

``up`` composes these instead of reading each report's own shape; the reasons are the words its
--json document and its log show."""

from __future__ import annotations

import pytest

from sparkctl.ops.build import BuildResult, LayerOutcome
from sparkctl.ops.distribute import DistributionReport, HostReport as CopyHost
from sparkctl.ops.doctor.run import DoctorReport
from sparkctl.ops.doctor.verdicts import FAIL, PASS, CheckResult
from sparkctl.ops.engram import HostOutcome as ShardHost, PackReport
from sparkctl.ops.model_sync import HostReport as SyncHost, SyncReport
from sparkctl.ops.smoke import Check, SmokeReport
from sparkctl.ops.steps import CHANGED, OK, StepFailed


def test_a_checkpoint_sync_is_ok_when_nothing_was_sent_and_names_what_was():
    same = SyncReport("/models/v4", [SyncHost("spark-1", "unchanged"), SyncHost("spark-2", "unchanged")], algo="xxh128", files=3)
    assert same.outcome() == (OK, "present and verified on 2 host(s) (3 files, xxh128)")
    sent = SyncReport("/models/v4", [SyncHost("spark-1", "unchanged"), SyncHost("spark-2", "synced", 2, 3 * 1048576)])
    status, reason = sent.outcome()
    assert status == CHANGED and reason.startswith("sent from /models/v4 to spark-2 (2 file(s), ") and "spark-1" not in reason
    with pytest.raises(StepFailed, match="^spark-2: disk full$"):
        SyncReport("x", [SyncHost("spark-1", "unchanged"), SyncHost("spark-2", "failed", error="disk full")]).outcome()


def test_a_build_says_which_layers_it_built_on_which_host():
    reused = BuildResult("sparkctl/v4:patch", "docker", layers=[LayerOutcome("base", "t", cached=True)])
    assert reused.outcome("spark-1") == (OK, "sparkctl/v4:patch on spark-1: every layer reused")
    built = BuildResult("sparkctl/v4:patch", "docker", layers=[LayerOutcome("base", "t", cached=True), LayerOutcome("patch", "p")],
                        seconds=2.5)
    assert built.outcome("spark-1") == (CHANGED, "built patch of sparkctl/v4:patch on spark-1 in 2.5 s")
    with pytest.raises(StepFailed, match="build of sparkctl/v4:patch on spark-1 failed: no space"):
        BuildResult("sparkctl/v4:patch", "docker", errors=["no space"]).outcome("spark-1")


def test_a_copy_names_the_hosts_it_loaded_and_the_ones_it_could_not():
    report = DistributionReport("sparkctl/v4:patch", "sha256:1", [CopyHost("spark-2", "loaded", "thin", 2 * 1048576),
                                                                  CopyHost("spark-3", "skipped")])
    assert report.outcome("spark-1") == (CHANGED, "copied sparkctl/v4:patch from spark-1 to spark-2 (thin, 2.0 MiB)")
    report.hosts[1] = CopyHost("spark-3", "failed", error="connection reset")
    with pytest.raises(StepFailed, match="^could not copy the image to spark-3: connection reset$"):
        report.outcome("spark-1")
    # every host had it when the step acted: nothing was copied, and the step says so
    already = DistributionReport("sparkctl/v4:patch", "sha256:1", [CopyHost("spark-2", "skipped"), CopyHost("spark-3", "skipped")])
    assert already.outcome("spark-1") == (OK, "sparkctl/v4:patch is already on every host")


def test_engram_shards_count_what_was_written_per_host():
    done = [{"action": "skipped"}, {"action": "write"}]
    report = PackReport("on-hosts", 2, "/e", [ShardHost("spark-1", 0, True, shards=done), ShardHost("spark-2", 1, True, shards=done[:1])], "done")
    assert report.outcome() == (CHANGED, "wrote 1 of 3 shard(s) (spark-1: 1, spark-2: 0)")
    report.hosts[0].shards = done[:1]
    assert report.outcome() == (OK, "2 shard(s) present and verified on 2 host(s)")
    report.hosts[1] = ShardHost("spark-2", 1, False, error="spark-2: no space for 4 GiB")
    with pytest.raises(StepFailed, match="^spark-2: no space for 4 GiB$"):
        report.outcome()


def test_doctor_fails_on_a_check_no_later_step_repairs_and_names_the_ones_it_leaves():
    checks = [CheckResult("ssh", PASS, "connected"), CheckResult("image", FAIL, "absent", "sparkctl build")]
    report = DoctorReport([("spark-1", checks)])
    with pytest.raises(StepFailed, match=r"^spark-1: image: absent \(fix: sparkctl build\)$"):
        report.outcome()
    assert report.outcome(lambda check: check.id == "image") == (
        OK, "2 checks on 1 host(s) passed; left to later steps: spark-1: image")


def test_smoke_names_each_failed_check():
    good = SmokeReport("http://spark-1:8000", [Check("models", True, 0.1, ""), Check("chat", True, 0.2, "")])
    assert good.outcome("v4") == (OK, "http://spark-1:8000 serves v4: 2 smoke checks passed")
    bad = SmokeReport("http://spark-1:8000", [Check("models", True, 0.1, ""), Check("chat", False, 0.2, "HTTP 500")])
    with pytest.raises(StepFailed, match="^http://spark-1:8000: smoke failed: chat: HTTP 500$"):
        bad.outcome("v4")


def test_every_report_up_composes_has_the_common_shape():
    from sparkctl.ops.native_deploy import NativeServeReport
    from sparkctl.ops.replica_serve import ReplicaSetReport
    from sparkctl.ops.serve import ServeReport
    from sparkctl.ops.setup import SetupReport
    from sparkctl.ops.steps import ReportShape

    for cls in (SyncReport, BuildResult, DistributionReport, PackReport, DoctorReport, SmokeReport, ServeReport,
                NativeServeReport, ReplicaSetReport, SetupReport):
        assert all(callable(getattr(cls, name, None)) for name in ("to_json", "outcome")), cls
        assert isinstance(getattr(cls, "ok", None), property) or "ok" in cls.__dataclass_fields__, cls
    assert isinstance(SyncReport("x", []), ReportShape) and not isinstance(object(), ReportShape)
