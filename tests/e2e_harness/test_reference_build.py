"""The reference extender and device plugin built from GPUSHARE_E2E_REFERENCE_SRC: the setting, the cache key, the
layout check, and one real build (cached) whose binaries start."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from e2e import toolchain
from e2e.settings import E2eSettings, from_environ

pytestmark = pytest.mark.timeout(1800)  # the first build downloads the extender's modules and compiles both


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("/srv/reference", Path("/srv/reference")), ("ref", Path.cwd() / "ref")],
)
def test_the_setting_names_an_absolute_folder_or_nothing(value: str | None, expected: Path | None) -> None:
    environ = {} if value is None else {"GPUSHARE_E2E_REFERENCE_SRC": value}
    assert from_environ(environ).reference_src == expected


def settings(tmp_path: Path, source: Path | None) -> E2eSettings:
    return E2eSettings(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", port_base=30000, reference_src=source)


def test_without_the_setting_one_line_says_what_to_set(tmp_path: Path) -> None:
    line = toolchain.reference_missing(settings(tmp_path, None))
    assert line == (
        "the reference extender and device plugin sources are not available: set GPUSHARE_E2E_REFERENCE_SRC to a "
        "folder with gpushare-scheduler-extender/ and gpushare-device-plugin/ (clones at commits c0b61411… and "
        "45fb8b88…)")
    assert toolchain.build_reference(settings(tmp_path, None)) is None


def test_without_go_one_line_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    line = toolchain.reference_missing(settings(tmp_path, tmp_path))
    assert line is not None and line.startswith("the Go toolchain (go) is not on PATH")


def fake_trees(root: Path) -> Path:
    for tree in toolchain.REFERENCE_TREES:
        (root / tree / "cmd").mkdir(parents=True)
        (root / tree / "cmd" / "main.go").write_text(f"package main // {tree}\n")
        (root / tree / "README.md").write_text("readme\n")
    return root


def test_a_folder_without_both_trees_is_an_error_naming_what_is_missing(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "gpushare-scheduler-extender").mkdir(parents=True)
    if shutil.which("go") is not None:
        assert toolchain.reference_missing(settings(tmp_path, source)) is None  # a wrong folder fails, never skips
    with pytest.raises(toolchain.ToolchainError) as error:
        toolchain.build_reference(settings(tmp_path, source))
    assert str(error.value) == (
        f"GPUSHARE_E2E_REFERENCE_SRC={source} lacks gpushare-device-plugin/: it must be a folder with "
        "gpushare-scheduler-extender/ and gpushare-device-plugin/ (clones at commits c0b61411… and 45fb8b88…)")


def test_the_cache_key_follows_every_file_and_the_go_version(tmp_path: Path) -> None:
    source = fake_trees(tmp_path / "a")
    key = toolchain.reference_key(source, "go1.26.8")
    assert len(key) == 16 and int(key, 16) >= 0
    assert toolchain.reference_key(fake_trees(tmp_path / "b"), "go1.26.8") == key  # contents, not the location
    assert toolchain.reference_key(source, "go1.25.0") != key
    changed = []
    main = source / "gpushare-device-plugin" / "cmd" / "main.go"
    main.write_text(main.read_text() + "// one more line\n")
    changed.append(toolchain.reference_key(source, "go1.26.8"))
    (source / "gpushare-device-plugin" / "cmd" / "extra.go").write_text("")
    changed.append(toolchain.reference_key(source, "go1.26.8"))
    (source / "gpushare-device-plugin" / "cmd" / "extra.go").rename(source / "gpushare-device-plugin" / "x.go")
    changed.append(toolchain.reference_key(source, "go1.26.8"))
    assert len({key, *changed}) == 4


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: unused}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
"""


def bare_env() -> dict[str, str]:
    """A process environment without any cluster configuration."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}


def test_the_reference_extender_starts_and_says_it_has_no_cluster(reference: Path) -> None:
    extender = reference / toolchain.EXTENDER_BINARY
    result = subprocess.run([str(extender)], env=bare_env(), capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode != 0
    assert "Error building kubeconfig" in result.stdout + result.stderr


def test_the_reference_device_plugin_lists_its_flags(reference: Path, tmp_path: Path) -> None:
    # Its package init builds the API client before flags are parsed: without a kubeconfig file and NODE_NAME it
    # exits before -h is read.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(server="https://127.0.0.1:1"))
    plugin = reference / toolchain.PLUGIN_BINARY
    result = subprocess.run([str(plugin), "-h"], env={**bare_env(), "KUBECONFIG": str(kubeconfig), "NODE_NAME": "x"},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    for flag in ("-memory-unit", "-health-check", "-query-kubelet", "-token", "-logtostderr"):
        assert flag in result.stderr


def test_the_build_is_cached(reference: Path) -> None:
    assert toolchain.build_reference(from_environ()) == reference
    assert not reference.with_name(reference.name + ".partial").exists()
    assert sorted(p.name for p in reference.iterdir()) == sorted([toolchain.EXTENDER_BINARY, toolchain.PLUGIN_BINARY])

