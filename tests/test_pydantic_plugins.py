"""The sparkctl command does without pydantic's plugins (their discovery reads every installed
package's metadata on each call) unless PYDANTIC_DISABLE_PLUGINS says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SPY = '''
import os
class Spy:
    def new_schema_validator(self, *args, **kwargs):
        with open(os.environ["SPY_FILE"], "a") as handle:
            handle.write("validator\\n")
        return None, None, None
plugin = Spy()
'''


@pytest.mark.parametrize("setting, observed", [(None, False), ("", True)])
def test_pydantic_plugins_are_off_unless_the_environment_asks(tmp_path, setting, observed):
    site = tmp_path / "site"
    (site / "spy_plugin-0.dist-info").mkdir(parents=True)
    (site / "spy_plugin-0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: spy-plugin\nVersion: 0\n")
    (site / "spy_plugin-0.dist-info" / "entry_points.txt").write_text("[pydantic]\nspy = spy_plugin:plugin\n")
    (site / "spy_plugin.py").write_text(SPY)
    spy_file = tmp_path / "spy.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)]), "SPY_FILE": str(spy_file)}
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    if setting is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = setting
    proc = subprocess.run([sys.executable, "-m", "sparkctl", "profiles", "--json"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().startswith(("{", "["))  # the command's answer is unchanged either way
    assert spy_file.exists() is observed
