from ranges import count_between, inclusive_range

print("inclusive_range(2, 5) =", inclusive_range(2, 5))
print("count_between(2, 5) =", count_between(2, 5))
