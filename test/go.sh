# Sourced by the test scripts: puts Go on PATH. sudo resets PATH to its
# secure_path, which does not hold /usr/local/go/bin, where Go's installer
# puts Go, so `sudo test/run.sh` would otherwise stop at the first go command.
if ! command -v go >/dev/null 2>&1; then
	for d in /usr/local/go/bin /usr/lib/go/bin ${SUDO_USER:+"$(getent passwd "$SUDO_USER" | cut -d: -f6)/go/bin"} ${SUDO_USER:+"$(getent passwd "$SUDO_USER" | cut -d: -f6)/sdk/go/bin"}; do
		if [ -x "$d/go" ]; then
			PATH="$d:$PATH"
			export PATH
			break
		fi
	done
fi
if ! command -v go >/dev/null 2>&1; then
	echo "$(basename "$0"): no go command in PATH, /usr/local/go/bin or /usr/lib/go/bin." >&2
	echo "  Install Go (https://go.dev/doc/install), or pass your PATH through sudo: sudo env PATH=\"\$PATH\" $0" >&2
	exit 1
fi
