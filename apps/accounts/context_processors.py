from .selectors import project_list_for_user


def projects(request):
    return {"user_projects": project_list_for_user(user=request.user) if hasattr(request, "user") else []}
