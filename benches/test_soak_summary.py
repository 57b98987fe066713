"""The soak summary's histogram quantile and scrape parsing."""

import soak_summary as s


def test_quantile_interpolates_within_the_bucket_of_the_difference():
    before = [(0.001, 10), (0.002, 10), (float("inf"), 10)]
    # 100 new observations: 50 under 1 ms, 50 between 1 and 2 ms.
    after = [(0.001, 60), (0.002, 110), (float("inf"), 110)]
    assert abs(s.quantile(0.5, before, after) - 0.001) < 1e-9
    assert abs(s.quantile(0.99, before, after) - 0.00198) < 1e-9


def test_quantile_of_nothing_new_is_none():
    same = [(0.001, 5), (float("inf"), 5)]
    assert s.quantile(0.99, same, same) is None


def test_parse_and_sum_by_label():
    scrape = s.parse(
        'retry_budget_decisions_total{action="ACTION_DEFERRED",code="deferred"} 7\n'
        'retry_budget_decisions_total{action="ACTION_SCHEDULE_RETRY",code="schedule_retry"} 5\n'
        "# EOF\n"
    )
    assert s.total(scrape, "retry_budget_decisions_total") == 12
    assert s.total(scrape, "retry_budget_decisions_total", action="ACTION_DEFERRED") == 7
