#!/usr/bin/env bash
# Sourced by the scripts that install pinned npm packages into a directory of their own under
# target/: `npm_install DIR PKG...`. A registry hiccup must not fail a whole CI run without a word,
# so each install is tried three times (5 s, then 20 s apart) and npm's errors are shown: the
# attempt's log goes to stderr when it fails.
npm_install() {
  local dir="$1"
  shift
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"private":true}' >"$dir/package.json"
  local attempt log="$dir/.npm-install.log"
  for attempt in 1 2 3; do
    if (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "$@") >"$log" 2>&1; then
      return 0
    fi
    echo "npm install $* in $dir: attempt $attempt failed:" >&2
    tail -25 "$log" | sed 's/^/    /' >&2
    [ "$attempt" = 3 ] || sleep $((attempt == 1 ? 5 : 20))
  done
  echo "npm install $* failed three times; check the npm registry (npm config get registry: $(npm config get registry 2>/dev/null))" >&2
  return 1
}
