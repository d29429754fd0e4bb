# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.runtime: where a harness runs. `sandbox` is the local bubblewrap sandbox (network namespace with only
the proxy reachable through `relay`, private HOME, connect trace); docker and apptainer runtimes come later.
"""

from nemo_polar.runtime.sandbox import Sandbox, SandboxError, SandboxResult, SandboxSpec, bwrap_available

__all__ = ["Sandbox", "SandboxError", "SandboxResult", "SandboxSpec", "bwrap_available"]
