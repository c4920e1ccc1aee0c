#!/usr/bin/env bash
# The documentation site (MkDocs with Material, mkdocs.yml; docs/contributing/index.md says why).
#   bash scripts/docs.sh               build it strictly (warnings and broken links are errors) into
#                                      build/site; the last line printed is the path of its index.html
#   bash scripts/docs.sh build         the same; build/site is its only folder (a build deletes and remakes
#                                      it), so 'build DIR' is refused (exit 2, nothing deleted) unless DIR is
#                                      build/site: copy the site from there
#   bash scripts/docs.sh serve [DIR]   serve the built site (build/site) on 127.0.0.1, a free port; prints
#                                      the URL, then serves until Ctrl-C
#   bash scripts/docs.sh chromium      install Debian's chromium if it is missing (root; the browser check
#                                      of tests/docs); prints its path
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
action=${1:-build}
site=${2:-build/site}
case "$action" in
  build)
    # The build empties its folder first, so it only ever takes its own: 'build docs' once deleted the
    # sources. Refused before anything runs (bootstrap included), and nothing else is ever removed.
    if [ "$(realpath -m -- "$site")" != "$(realpath -m -- "$root/build/site")" ]; then
      echo "docs: builds only into build/site; refusing '$site' (the site is always build/site; copy it from there)" >&2
      exit 2
    fi
    site=$root/build/site
    bash scripts/bootstrap.sh --no-compile
    rm -rf "$site"
    # mkdocs logs to stderr; --strict also comes from mkdocs.yml (strict: true), said here for a reader.
    NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --quiet --site-dir "$site" >&2
    echo "$(cd "$site" && pwd)/index.html"
    ;;
  serve)
    [ -f "$site/index.html" ] || { echo "docs: $site/index.html is missing; run 'bash scripts/docs.sh' first" >&2; exit 2; }
    # A free port chosen by the kernel (bind to port 0), bound to loopback only: the site is for this host.
    exec .venv/bin/python - "$site" <<'PY'
import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
handler.log_message = lambda *args: None  # one line per request is noise here
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
print(f"http://127.0.0.1:{server.server_address[1]}/", flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
PY
    ;;
  chromium)
    if ! command -v chromium >/dev/null 2>&1; then
      [ "$(id -u)" -eq 0 ] || { echo "docs: chromium is missing; install Debian's package: apt-get install chromium" >&2; exit 2; }
      log=$(mktemp)
      echo "docs: installing chromium (Debian's package)" >&2
      export DEBIAN_FRONTEND=noninteractive
      # One apt at a time across the project's scripts (the suite starts services side by side).
      { flock -w 900 /tmp/mldist-apt.lock apt-get update -qq &&
        flock -w 900 /tmp/mldist-apt.lock apt-get install -y -qq --no-install-recommends chromium; } >"$log" 2>&1 ||
        { tail -n 5 "$log" >&2; echo "docs: apt-get install chromium failed (log: $log)" >&2; exit 1; }
      rm -f "$log"
    fi
    command -v chromium
    ;;
  *)
    echo "docs: unknown action '$action'; use build, serve [DIR] or chromium" >&2
    exit 2
    ;;
esac
