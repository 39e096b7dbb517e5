#!/bin/bash
cat > /app/bin/greet.sh <<'SH'
#!/bin/sh
echo "Hello, ${1:-stranger}!"
SH
