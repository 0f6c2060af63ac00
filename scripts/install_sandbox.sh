#!/usr/bin/env bash
# The coding agent runs its commands in bubblewrap's sandbox on Linux (macOS has Seatbelt built
# in). Installs Debian's or Fedora's package where this user may (root, or sudo without a
# password); otherwise says in one line how to, and `tiny-llm agent run` refuses commands
# until it is there (or runs them with --unsandboxed-commands).
set -uo pipefail
[ "$(uname -s)" = Linux ] || exit 0
command -v bwrap >/dev/null && exit 0
if [ "$(id -u)" = 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo"; else
    echo "bubblewrap (bwrap) is not installed and this user cannot install packages: the agent's commands" \
         "will be refused until it is (apt-get install bubblewrap)"
    exit 0
fi
if command -v apt-get >/dev/null; then
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bubblewrap >/dev/null; } \
        || echo "could not install bubblewrap with apt-get: the agent's commands will be refused"
elif command -v dnf >/dev/null; then
    $SUDO dnf install -y -q bubblewrap >/dev/null || echo "could not install bubblewrap with dnf"
else
    echo "bubblewrap (bwrap) is not installed: install it with your package manager for the agent's sandbox"
fi
exit 0
