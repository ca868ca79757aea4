#!/bin/bash
set -e
cd /app
cat > /app/build.sh <<'SCRIPT'
#!/bin/bash
# Build dist/greeter-<VERSION>.pyz and its .sha256 from src/greeter.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$root/src
dist=$root/dist

version=$(sed -n 's/^VERSION = "\([^"]*\)".*/\1/p' "$src/greeter/__init__.py")
[ -n "$version" ] || { echo "build.sh: no VERSION in $src/greeter/__init__.py" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/greeter"
cp "$src"/greeter/*.py "$stage/greeter/"

rm -rf "$dist"
mkdir -p "$dist"
name=greeter-$version.pyz
python3 -m zipapp "$stage" -o "$dist/$name" -p "/usr/bin/env python3" -m "greeter.__main__:main"
(cd "$dist" && sha256sum "$name" > "$name.sha256")
echo "built $dist/$name"
SCRIPT
bash /app/build.sh
