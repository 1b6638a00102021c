"""The tier's table of Kubernetes releases (e2e/versions.py): one row per release, each with its pinned build
modules, the gates each component gets, and the settings variable that picks one; and the matrix's judging."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from common.settings import SettingsError
from e2e import control, matrix, versions
from e2e.settings import E2eSettings, from_environ


def test_the_default_is_the_newest_release_and_the_table_is_ordered() -> None:
    minors = [row.minor for row in versions.RELEASES]
    assert minors == sorted(minors) and len(set(minors)) == len(minors)
    assert versions.RELEASES[-1].kubernetes == versions.DEFAULT
    assert from_environ({}).kubernetes_version == versions.DEFAULT


@pytest.mark.parametrize("row", versions.RELEASES, ids=lambda r: r.kubernetes)
def test_every_release_has_pinned_build_modules_of_its_versions(row: versions.Release) -> None:
    k8s = (versions.k8s_module_dir(row) / "go.mod").read_text()
    assert f"k8s.io/kubernetes {row.kubernetes}" in k8s and f"go.etcd.io/etcd/server/v3 {row.etcd}" in k8s
    # Every staging module is replaced by its published version of the same release, none by a local path.
    replaced = re.findall(r"^\t(k8s\.io/\S+) => (\S+) (\S+)$", k8s, re.MULTILINE)
    assert replaced and all(name == target and version == row.staging for name, target, version in replaced)
    assert (versions.k8s_module_dir(row) / "go.sum").stat().st_size > 0
    containerd = (versions.containerd_module_dir(row) / "go.mod").read_text()
    assert f"github.com/containerd/containerd/v2 {row.containerd}" in containerd


def test_the_go_mod_of_a_release_replaces_exactly_the_staging_modules_upstream_replaces() -> None:
    row = versions.release("v1.37.2")
    upstream = ("module k8s.io/kubernetes\n\ngo 1.26.0\n\ngodebug default=go1.26\n\nreplace (\n"
                "\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/streaming => ./staging/src/k8s.io/streaming\n)\n")
    text = versions.k8s_go_mod(row, upstream)
    assert "go 1.26.0" in text and "godebug default=go1.26" in text
    assert "\tk8s.io/api => k8s.io/api v0.37.2\n\tk8s.io/streaming => k8s.io/streaming v0.37.2\n" in text
    with pytest.raises(ValueError, match="no go directive"):
        versions.k8s_go_mod(row, "module k8s.io/kubernetes\n")


def test_gates_are_passed_only_where_a_release_needs_them(tmp_path: Path) -> None:
    """1.35 needs DRAConsumableCapacity on (alpha); 1.36 and 1.37 have it on by default and get no gate at all, so
    no component is handed a gate its release no longer knows."""
    def gates(version: str) -> list[str]:
        settings = E2eSettings(cache_dir=tmp_path, run_dir=tmp_path, port_base=30000, kubernetes_version=version)
        argv = control.apiserver(settings, tmp_path / "kube-apiserver", tmp_path, (tmp_path / "p", tmp_path / "l"))
        argv += control.scheduler(settings, tmp_path / "s", tmp_path / "c", tmp_path / "k")
        argv += control.controller_manager(settings, tmp_path / "cm", tmp_path, tmp_path / "k")
        return [a for a in argv if a.startswith("--feature-gates")]

    assert gates("v1.35.4") == ["--feature-gates=DRAConsumableCapacity=true"] * 3
    assert gates("v1.36.3") == gates("v1.37.2") == []


def test_the_controller_manager_is_never_given_a_controller_its_release_lacks(tmp_path: Path) -> None:
    def controllers(version: str) -> str:
        settings = E2eSettings(cache_dir=tmp_path, run_dir=tmp_path, port_base=30000, kubernetes_version=version)
        argv = control.controller_manager(settings, tmp_path / "cm", tmp_path, tmp_path / "k")
        return next(a for a in argv if a.startswith("--controllers="))

    assert "-service-lb-controller" in controllers("v1.36.3")
    assert controllers("v1.37.2") == "--controllers=*,-nodeipam,-persistentvolume-binder"


def test_an_unknown_release_is_refused_naming_the_supported_ones() -> None:
    assert versions.release("1.36.3").kubernetes == "v1.36.3"
    with pytest.raises(SettingsError, match=r"GPUSHARE_E2E_KUBERNETES: Kubernetes v1.33.0 is not in .*v1\.35\.4"):
        from_environ({"GPUSHARE_E2E_KUBERNETES": "v1.33.0"})


def test_the_matrix_judges_each_check_from_the_junit_report(tmp_path: Path) -> None:
    suite = ET.Element("testsuite")
    for classname, name, outcome in (
        ("tests.e2e.test_scenario", "test_every_container_on_its_pods_gpu[the-bug-report-env]", None),
        ("tests.e2e.test_scenario", "test_every_container_on_its_pods_gpu[env-mixed-sizes]", None),
        ("tests.e2e.test_scenario", "test_every_container_on_its_pods_gpu[cdi-the-bug-report]", "failure"),
        ("tests.e2e.test_dra", "test_the_bug_report_with_claims", "skipped"),
    ):
        case = ET.SubElement(suite, "testcase", classname=classname, name=name)
        if outcome:
            ET.SubElement(case, outcome)
    junit = tmp_path / "junit.xml"
    ET.ElementTree(suite).write(junit)
    verdicts = matrix._verdicts(junit)
    by_name = {c.name: matrix.judge(c, verdicts) for c in matrix.CHECKS}
    assert by_name["bug report, env, real extender"] == "pass"
    assert by_name["bug report, cdi, real extender"] == "FAIL"
    assert by_name["DRA"] == "skip"
    assert by_name["plugin and kubelet restarts"] == "not run"


def test_the_matrix_writes_its_table_between_the_readmes_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{matrix.BEGIN}\nold\n{matrix.END}\n\nafter\n")
    kept = tmp_path / "matrix"
    matrix.save(matrix.Row("v1.37.2", {c.name: "pass" for c in matrix.CHECKS}, {"env": 17.0}, "", "d1 on c1"), kept)
    matrix.save(matrix.Row("v1.35.4", {c.name: "FAIL" for c in matrix.CHECKS}, {}, "", "d2 on c2"), kept)
    rows = matrix.saved(kept)
    assert [r.release for r in rows] == ["v1.35.4", "v1.37.2"]  # in the table's order, whenever each ran
    matrix.write_readme(matrix.table(rows), readme)
    text = readme.read_text()
    assert "old" not in text and "| bug report, first create to last start, env | - | 17 s |" in text
    assert "| measured | d2 on c2 | d1 on c1 |" in text and text.endswith("\n\nafter\n")
    readme.write_text("no block\n")
    with pytest.raises(SystemExit, match="no version matrix block"):
        matrix.write_readme("t", readme)
