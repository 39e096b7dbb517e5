#!/bin/bash
# Half the reward per behaviour; Harbor reads the "reward" key of reward.json.
score=0
[ "$(sh /app/bin/greet.sh Ada 2>/dev/null)" = "Hello, Ada!" ] && score=$((score + 1))
[ "$(sh /app/bin/greet.sh 2>/dev/null)" = "Hello, stranger!" ] && score=$((score + 1))
echo "passed $score of 2"
printf '{"reward": %s, "passed": %d}\n' "$(awk "BEGIN { print $score / 2 }")" "$score" > /logs/verifier/reward.json
