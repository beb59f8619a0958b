"""The bearer header, spelled once (shared/auth.py): what a process sends and what one checks."""

from shared.auth import bearer_header, bearer_matches


def test_the_header_a_process_sends_is_the_one_a_process_checks():
    assert bearer_header("t0ken") == {"Authorization": "Bearer t0ken"}
    assert bearer_header(None) == {} and bearer_header("") == {}  # no token, no header
    assert bearer_matches(bearer_header("t0ken")["Authorization"], "t0ken")
    assert not bearer_matches("Bearer t0ke", "t0ken") and not bearer_matches("t0ken", "t0ken")
