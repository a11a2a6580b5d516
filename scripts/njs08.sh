#!/usr/bin/env bash
# Debian 12 ships njs 0.7.9, which has no js_shared_dict_zone. This unpacks
# Debian 13's nginx 1.26 + njs 0.8 packages (and their libraries) into
# .njs-0.8/root and writes wrappers that run them with Debian 13's own loader,
# leaving the system untouched:  .njs-0.8/bin/nginx  .njs-0.8/bin/njs
set -euo pipefail
cd "$(dirname "$0")/.."
D="$PWD/.njs-0.8"
if [ -x "$D/bin/nginx" ] && "$D/bin/nginx" -v >/dev/null 2>&1; then echo "njs 0.8: $("$D/bin/njs" -v) (cached)"; exit 0; fi
rm -rf "$D"
mkdir -p "$D"/apt/{lists/partial,archives/partial} "$D/root" "$D/bin"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > "$D/apt/sources.list"
: > "$D/apt/status"
A=(-o "Dir::Etc::SourceList=$D/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State=$D/apt" -o "Dir::State::Lists=$D/apt/lists"
   -o "Dir::State::status=$D/apt/status" -o "Dir::Cache=$D/apt" -o "Dir::Cache::archives=$D/apt/archives" -o APT::Architecture=amd64 -o Debug::NoLocking=1)
apt-get "${A[@]}" -qq update
apt-get "${A[@]}" -qq -y --download-only --no-install-recommends install nginx libnginx-mod-http-js njs >/dev/null
for f in "$D"/apt/archives/*.deb; do dpkg-deb -x "$f" "$D/root"; done
R="$D/root"
LP="$R/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu"
for b in nginx:usr/sbin/nginx njs:usr/bin/njs; do
  cat > "$D/bin/${b%%:*}" <<W
#!/bin/sh
exec "$R/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$LP" "$R/${b#*:}" "\$@"
W
  chmod +x "$D/bin/${b%%:*}"
done
echo "$R/usr/lib/nginx/modules" > "$D/modules-path"
rm -rf "$D/apt/archives"
echo "njs 0.8: nginx $("$D/bin/nginx" -v 2>&1 | sed 's/.*nginx\///'), njs $("$D/bin/njs" -v)"
