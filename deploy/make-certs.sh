#!/usr/bin/env bash
# Make a CA and certificates for the scheduler, the workers and the clients (TLS with client certificates).
#   deploy/make-certs.sh DIR [--ca-dir CADIR] [HOST ...]   (HOSTs go into subjectAltName; localhost and
#                                                          127.0.0.1 always)
# DIR gets ca.pem and the role certificates and keys: copy DIR/ca.pem everywhere, scheduler*.pem to the
# scheduler node, worker*.pem to worker nodes, client*.pem to the people who may submit work. The CA key,
# which can sign a certificate for anyone, goes to CADIR (--ca-dir, else MR_CA_DIR, else DIR-ca; mode 700),
# never inside DIR, and stays on the machine that made it. A CADIR that already holds a CA is reused, so
# certificates made later (a new host name, a renewal) are trusted by nodes that have the old ca.pem.
# Keys are mode 600. Certificates last 365 days.
set -euo pipefail
usage="usage: deploy/make-certs.sh DIR [--ca-dir CADIR] [HOST ...]"
dir=${1:?$usage}; shift || true
dir=${dir%/}
cadir=${MR_CA_DIR:-$dir-ca}
hosts=()
while [ $# -gt 0 ]; do
  case $1 in
    --ca-dir) cadir=${2:?$usage}; shift 2 ;;
    -*) echo "make-certs.sh: unknown option $1; $usage" >&2; exit 2 ;;
    *) hosts+=("$1"); shift ;;
  esac
done
cadir=${cadir%/}
command -v openssl >/dev/null || { echo "make-certs.sh needs openssl" >&2; exit 2; }
case "$(realpath -m "$cadir")/" in  # DIR is what gets copied to nodes: the CA key must not ride along
  "$(realpath -m "$dir")/"*) echo "make-certs.sh: the CA folder $cadir must not be inside $dir" >&2; exit 2;;
esac
if [ -e "$cadir/ca-key.pem" ] && [ ! -f "$cadir/ca.pem" ]; then
  echo "make-certs.sh: $cadir has ca-key.pem but no ca.pem; restore it or choose another --ca-dir" >&2; exit 2
fi
umask 077; mkdir -p "$dir" "$cadir"; chmod 700 "$cadir"
san="DNS:localhost,IP:127.0.0.1"
for h in ${hosts[@]+"${hosts[@]}"} "$(hostname)"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
done
if [ -f "$cadir/ca-key.pem" ]; then
  reused=" (reused)"
else
  reused=""
  openssl req -x509 -newkey rsa:3072 -nodes -days 365 -subj "/CN=multireduce-ca" \
    -keyout "$cadir/ca-key.pem" -out "$cadir/ca.pem" 2>/dev/null
fi
cp "$cadir/ca.pem" "$dir/ca.pem"
for role in scheduler worker client; do
  openssl req -newkey rsa:3072 -nodes -subj "/CN=multireduce-$role" \
    -keyout "$dir/$role-key.pem" -out "$cadir/$role.csr" 2>/dev/null
  printf "subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n" "$san" > "$cadir/$role.ext"
  openssl x509 -req -in "$cadir/$role.csr" -CA "$cadir/ca.pem" -CAkey "$cadir/ca-key.pem" \
    -CAserial "$cadir/ca.srl" -CAcreateserial -days 365 -extfile "$cadir/$role.ext" -out "$dir/$role.pem" 2>/dev/null
  rm -f "$cadir/$role.csr" "$cadir/$role.ext"
done
chmod 644 "$dir"/*.pem "$cadir/ca.pem"; chmod 600 "$dir"/*-key.pem "$cadir/ca-key.pem"
echo "certificates in $dir: ca.pem, scheduler.pem, worker.pem, client.pem (+ keys); CA$reused in $cadir (keep it off the nodes)"
