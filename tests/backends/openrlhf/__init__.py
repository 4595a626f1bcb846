"""OpenRLHF integration tests. OpenRLHF imports ``vllm`` and ``flash_attn`` at module level:
the package installs their test stubs before any of its modules imports OpenRLHF, so each
test file also runs alone."""

from tests.helpers.openrlhf_stubs import install_openrlhf_stubs

install_openrlhf_stubs()
