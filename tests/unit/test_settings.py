

def test_no_ui_leaves_the_api_and_removes_the_page():
    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.settings import Settings

    with_page = TestClient(create_app(Settings(), engine=object()))
    assert with_page.get("/").status_code == 200 and "ui/app.js" in with_page.get("/").text
    assert with_page.get("/ui/app.js").status_code == 200
    without = TestClient(create_app(Settings(ui=False), engine=object()))
    assert without.get("/").status_code == 404 and without.get("/ui/app.js").status_code == 404
    assert without.get("/v1/models").status_code == 200
