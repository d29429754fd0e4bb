# SPDX-License-Identifier: Apache-2.0
"""The shell analyser: compound commands by their strongest effect, heredocs, wrappers, paths and tests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nemo_polar.credit.config import RoleConfig
from nemo_polar.credit.shell import analyse_shell

ORDER = RoleConfig().effect_order


def top(cmd: str) -> str:
    res = analyse_shell(cmd)
    eff = res.strongest(ORDER)
    assert eff is not None
    return eff.effect


@pytest.mark.parametrize(
    ("cmd", "effect"),
    [
        ("cat src/a.py | grep -n foo | head -5", "IG"),
        ("cd /repo && python -m pytest tests/test_a.py -q 2>&1 | tail -20", "RV"),
        ("sed -i 's/a/b/' src/a.py && pytest -q", "AE"),
        ("sed -n '1,20p' src/a.py", "IG"),
        ("echo 'x = 1' > src/const.py", "AE"),
        ("pytest -q > /tmp/out.log; cat /tmp/out.log", "RV"),
        ("bash -lc 'cd /repo && npm test'", "RV"),
        ('sh -c "git apply fix.patch"', "AE"),
        ("(cd web && yarn test --watchAll=false)", "RV"),
        ("timeout 60 env PYTHONPATH=src python -m unittest tests.test_a", "RV"),
        ("find . -name '*.orig' -delete", "AE"),
        ("find . -name '*.py' -exec grep -l foo {} \\;", "IG"),
        ("find . -name '*.py' | xargs sed -i 's/foo/bar/'", "AE"),
        ("git diff HEAD~1 -- src/a.py", "IG"),
        ("git checkout -- src/a.py", "AE"),
        ("git stash && pytest -q; git stash pop", "RV"),
        ("python reproduce.py", "EXEC"),
        ("python -c 'import a; print(a.__file__)'", "EXEC"),
        ("python -c \"open('a.txt','w').write('x')\"", "AE"),
        ("python - <<'EOF'\nfrom pathlib import Path\nPath('a.py').write_text('x')\nEOF", "AE"),
        ("python - <<EOF\nprint(1)\nEOF", "EXEC"),
        ("cat > src/new.py <<'EOF'\nx = 1\nEOF", "AE"),
        ("apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: src/a.py\n@@\n-a\n+b\n*** End Patch\nEOF", "AE"),
        ("pip install -e . && python -m pytest -x", "RV"),
        ("pip install requests", "SETUP"),
        ("npm install lodash", "AE"),
        ("go test ./... && go vet ./...", "RV"),
        ("cargo test parser", "RV"),
        ("make test", "RV"),
        ("pytest --collect-only -q", "IG"),
        ("npx tsc --noEmit", "RV"),
        ("tee src/out.txt < input.txt", "AE"),
        ("ls -la; echo done", "IG"),
        ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A", "SUBMIT"),
        ("perl -pi -e 's/a/b/' lib/x.pl", "AE"),
        ("awk '{print $1}' data.csv", "IG"),
        ("rm -rf build && mkdir build", "AE"),
    ],
)
def test_strongest_effect(cmd: str, effect: str) -> None:
    assert top(cmd) == effect


def test_paths_and_test_targets_are_collected() -> None:
    res = analyse_shell(
        "cp src/a.py src/b.py && python -m pytest tests/test_b.py::test_x -q && sed -i s/a/b/ lib/c.py"
    )
    assert "src/b.py" in res.paths_written and "lib/c.py" in res.paths_written
    assert "src/a.py" in res.paths_read
    assert "tests/test_b.py::test_x" in res.test_targets
    assert res.scoped


def test_unscoped_verification() -> None:
    res = analyse_shell("cd /repo && pytest -q")
    assert not res.scoped and top("cd /repo && pytest -q") == "RV"


def test_heredoc_body_is_not_parsed_as_commands() -> None:
    # the body mentions rm and pytest, but it is data written to a file
    res = analyse_shell("cat > notes.md <<'EOF'\nrm -rf /\npytest\nEOF\nls")
    effects = [c.effect for c in res.commands]
    assert effects.count("AE") == 1 and "RV" not in effects
    assert res.paths_written == {"notes.md"}


def test_unbalanced_quotes_do_not_raise() -> None:
    assert top('grep -n "unterminated src/a.py') == "IG"


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("ab /.-|&;()<>'\"\\$`\n=*{}EOF")),
        max_size=80,
    ).map(lambda s: s.replace("E", "<<").replace("F", "sed -i ").replace("O", "pytest "))
)
def test_any_text_is_analysed_without_raising(cmd: str) -> None:
    res = analyse_shell(cmd)
    assert all(c.effect in {"IG", "AE", "RV", "EXEC", "SETUP", "NEUTRAL", "SUBMIT"} for c in res.commands)
