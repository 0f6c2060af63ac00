from shop import calc_total

basket = [2.50, 4.25, 1.00]
print("total:", calc_total(basket))
print("with 10% off:", calc_total(basket, discount=0.1))
