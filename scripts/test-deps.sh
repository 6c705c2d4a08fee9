#!/usr/bin/env bash
# System tools the test suite uses, from Debian's packages when missing: headless
# Chromium (the status page test), Python's jinja2 (the chat-template parity
# reference) and nats-server (the replicas' bus; tests start their own on 127.0.0.1,
# never the package's service). Run by `npm test`; needs root (or the tools already
# present) to install.
set -uo pipefail
missing=()
python3 -c 'import jinja2' 2>/dev/null || /usr/bin/python3 -c 'import jinja2' 2>/dev/null \
  || missing+=(python3-jinja2)
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "test-deps: installing ${missing[*]} from Debian's packages" >&2
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "test-deps: not root or no apt-get: install ${missing[*]} yourself; their tests will fail" >&2
  exit 0
fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
  || echo "test-deps: could not install ${missing[*]}; their tests will fail" >&2
exit 0
