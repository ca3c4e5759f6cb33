"""Research on the models the product serves: training and evaluation of ocria-tiny. Never imported by the product."""
